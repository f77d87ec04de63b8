"""The demo: processes it starts, the scenario it writes, the environment it sets, and that it cleans up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from anatomy.vocabulary import Component
from tui import demo
from tui.sources.anatomy_source import AnatomySource

REPO = Path(__file__).resolve().parents[2]


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_demo_without_training(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANATOMY_TOP_SIMULATE", raising=False)
    monkeypatch.setenv("ANATOMY_TOP_DIR", "/previous/value")
    handle = demo.start_demo(n_gpus=4, n_sleepers=5, train=False, install_signal_handlers=False)
    pids = [p.pid for p in handle.sleepers]
    try:
        assert handle.train is None and len(pids) == 5
        for i, pid in enumerate(pids):
            assert " ".join(psutil.Process(pid).cmdline()) == demo.SLEEPERS[i][0]
            assert psutil.Process(pid).name() == demo.SLEEPERS[i][0].split()[0]
        assert os.environ["ANATOMY_TOP_SIMULATE"] == str(handle.scenario_path)
        assert os.environ["ANATOMY_TOP_DIR"] == str(handle.runtime_dir)
        assert handle.runtime_dir.stat().st_mode & 0o777 == 0o700
        scenario = json.loads(handle.scenario_path.read_text())
        assert len(scenario["gpus"]) == 4
        placed = {p["pid"]: p["gpu_index"] for p in scenario["processes"]}
        assert placed == {pid: 1 + i % 3 for i, pid in enumerate(pids)}  # GPU 0 kept for the training job
    finally:
        handle.stop()
    assert all(_gone(pid) for pid in pids)
    assert "ANATOMY_TOP_SIMULATE" not in os.environ
    assert os.environ["ANATOMY_TOP_DIR"] == "/previous/value"
    assert not handle.directory.exists()
    handle.stop()  # idempotent


def test_demo_says_why_without_torch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(demo, "torch_available", lambda: False)
    with demo.start_demo(n_gpus=2, n_sleepers=1, install_signal_handlers=False) as handle:
        assert handle.train is None and len(handle.sleepers) == 1
        assert not handle.wait_until_publishing(timeout=0.1)
        assert handle.scenario_path.exists()
    err = capsys.readouterr().err
    assert "train" in err and "torch is not installed" in err


_CHILD = textwrap.dedent(
    """
    import sys, time
    from tui import demo
    handle = demo.start_demo(n_gpus=2, n_sleepers=3, train=False)
    print(" ".join(str(p.pid) for p in handle.sleepers), flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_children_die_with_the_monitor(sig: signal.Signals) -> None:
    # SIGTERM/SIGHUP: the demo's handler stops everything; SIGKILL: the children's parent-death signal.
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD], cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 3 and all(psutil.pid_exists(p) for p in pids)
        proc.send_signal(sig)
        proc.wait(timeout=10)
        assert all(_gone(pid) for pid in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


MODEL_TRAINING = (Component.WEIGHTS, Component.OPTIMIZER_STATES, Component.GRADIENTS, Component.ACTIVATIONS)


@pytest.mark.slow
def test_demo_training_job_publishes(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.delenv("ANATOMY_TOP_SIMULATE", raising=False)
    monkeypatch.delenv("ANATOMY_TOP_DIR", raising=False)
    with demo.start_demo(n_gpus=8, n_sleepers=2, install_signal_handlers=False) as handle:
        assert handle.train is not None
        scenario = json.loads(handle.scenario_path.read_text())
        assert {"pid": handle.train_pid, "gpu_index": 0}.items() <= next(
            p for p in scenario["processes"] if p["pid"] == handle.train_pid
        ).items()
        assert handle.wait_until_publishing(timeout=90), handle.train_log.read_text(errors="replace")
        procs = []
        with AnatomySource(handle.runtime_dir) as source:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                procs = [p for p in source.poll() if p.snapshot is not None]
                if procs or handle.train.poll() is not None:
                    break
                time.sleep(0.2)
        log = handle.train_log.read_text(errors="replace") if handle.train_log.exists() else ""
        assert procs, f"no snapshot from the demo's training job; its log:\n{log}"
        (proc,) = procs
        assert proc.pid == handle.train_pid and proc.state == "live"
        assert proc.hello is not None and proc.hello.model_class == "BertForSequenceClassification"
        weights = proc.snapshot.memory[Component.WEIGHTS.value]
        # fp32 parameters plus a few small integer buffers (position ids, token type ids)
        assert weights is not None and 0 <= weights - 4 * proc.hello.parameter_count <= 64 * 1024
        assert proc.snapshot.memory[Component.OPTIMIZER_STATES.value] is not None
        # the demo's model is sized so that the training components dominate the bar at the peak
        at_peak, peak = proc.snapshot.at_peak, proc.snapshot.peak_bytes
        assert at_peak is not None and peak is not None and sum(v or 0 for v in at_peak.values()) == peak
        training = sum(at_peak[c.value] or 0 for c in MODEL_TRAINING)
        assert training > 1.5 * (at_peak[Component.UNATTRIBUTED.value] or 0), at_peak
        assert 15e6 <= proc.hello.parameter_count <= 45e6
    assert _gone(handle.train.pid)


@pytest.mark.slow
def test_demo_train_refuses_an_unusable_device_without_traceback() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is usable here")
    done = subprocess.run(
        [sys.executable, "-m", "tui.demo_train", "--device", "cuda", "--steps", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "device 'cuda' is not usable" in done.stderr and "Traceback" not in done.stderr
