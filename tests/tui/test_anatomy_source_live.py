"""AnatomySource and `anatomy-top --once [--json]` against real CPU training processes publishing through
the real hook (tui.demo_train): the figures shown are exactly the hook's, and an OOM leaves its record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from anatomy import protocol
from anatomy.protocol import Hello, Snapshot
from anatomy.vocabulary import Component
from tui import format as fmt
from tui.sources.anatomy_source import AnatomySource
from tui.sources.reconcile import reconcile

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--batch", "4", "--seq", "32", "--sample-every", "2"]


def start_job(runtime: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, ANATOMY_TOP_DIR=str(runtime))
    env.pop("ANATOMY_TOP", None)
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tui.demo_train", *SMALL, *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_job(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_for_log(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace")
        if text in content:
            return
        if proc.poll() is not None and text not in log.read_text(errors="replace"):
            break
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in the training log:\n{log.read_text(errors='replace')}")


@pytest.fixture(scope="module")
def lingering(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("live")
    runtime = base / "run"
    runtime.mkdir(mode=0o700)
    log = base / "train.log"
    proc = start_job(runtime, log, "--steps", "3", "--linger")
    try:
        wait_for_log(log, "lingering", proc)
        yield proc, runtime, base
    finally:
        stop_job(proc)


def hook_view(runtime: Path, pid: int) -> tuple[Hello, Snapshot]:
    with protocol.Reader(runtime / protocol.socket_name(pid)) as reader:
        reader.wait(timeout=10)
        assert reader.hello is not None and reader.snapshot is not None
        return reader.hello, reader.snapshot


def test_source_sees_exactly_the_hooks_snapshot(lingering) -> None:
    proc, runtime, _ = lingering
    hello, snap = hook_view(runtime, proc.pid)
    with AnatomySource(runtime) as source:
        (seen,) = source.poll(wait_for_first_s=5.0)
    assert seen.state == "live" and seen.pid == proc.pid
    assert seen.hello == hello and seen.snapshot == snap
    # The history's figure is the step's peak, what the anatomy table's rows add up to.
    assert snap.peak_bytes is not None and snap.at_peak is not None
    assert seen.memory_history == (snap.peak_bytes,) == (sum(v or 0 for v in snap.at_peak.values()),)


def _once(runtime: Path, base: Path, pid: int, *flags: str) -> subprocess.CompletedProcess[str]:
    from tui.demo import build_scenario

    scenario = base / "scenario.json"
    build_scenario(pid, [], n_gpus=2).to_json(scenario)
    env = dict(os.environ, ANATOMY_TOP_SIMULATE=str(scenario), ANATOMY_TOP_DIR=str(runtime))
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", "--once", *flags],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_once_text_prints_the_hooks_figures(lingering) -> None:
    proc, runtime, base = lingering
    hello, snap = hook_view(runtime, proc.pid)
    done = _once(runtime, base, proc.pid)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"Training process {proc.pid}" in out and hello.model_class in out
    rec = reconcile(hello, snap, None)
    lines = out.splitlines()
    for row in rec.rows:
        line = next(ln for ln in lines if ln.strip().startswith(row.label))
        assert fmt.fmt_bytes(row.bytes, na=fmt.UNMEASURED) in line, (row, line)
    assert "NVIDIA H100 80GB HBM3" in out  # the nvidia-smi part is there too


def test_once_json_carries_hello_snapshot_and_rows(lingering) -> None:
    proc, runtime, base = lingering
    hello, snap = hook_view(runtime, proc.pid)
    done = _once(runtime, base, proc.pid, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (entry,) = doc["training"]
    assert entry["pid"] == proc.pid and entry["state"] == "live"
    assert protocol.from_dict(entry["hello"]) == hello
    assert protocol.from_dict(entry["snapshot"]) == snap
    # the simulated box puts this PID on GPU 0 with a fixed figure: NVML's view for the process
    gpu_procs = [p for p in doc["processes"] if p["pid"] == proc.pid]
    assert gpu_procs and entry["nvml_process_bytes"] == max(p["gpu_memory"] for p in gpu_procs)
    rows = {r["component"]: r["max_bytes"] for r in entry["reconciled"]["rows"]}
    assert rows == {c.value: snap.memory.get(c.value) for c in Component if c.value in rows}
    # "bytes" is the split at the peak (F1): the hook's own figures, summing to its peak
    assert snap.at_peak is not None
    at_peak = {r["component"]: r["bytes"] for r in entry["reconciled"]["rows"]}
    assert at_peak == {c.value: snap.at_peak.get(c.value) for c in Component if c.value in rows}
    assert sum(at_peak.values()) == snap.peak_bytes == entry["reconciled"]["total"]
    assert Component.CUDA_CONTEXT.value not in rows  # a CPU job


def test_oom_leaves_a_record_with_the_last_anatomy(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    log = tmp_path / "train.log"
    proc = start_job(runtime, log, "--oom-at-step", "3")
    try:
        proc.wait(timeout=120)
    finally:
        stop_job(proc)
    assert proc.returncode != 0
    oom_file = protocol.oom_path(runtime, proc.pid)
    assert oom_file.exists(), log.read_text(errors="replace")
    hello, snap = protocol.read_oom_file(oom_file)
    with AnatomySource(runtime) as source:
        (seen,) = source.poll()
        assert seen.state == "oom" and seen.pid == proc.pid
        assert seen.oom is not None and "simulated by the anatomy-top demo" in seen.oom
        assert seen.hello == hello and seen.snapshot == snap
        assert snap.memory[Component.WEIGHTS.value] is not None
        assert source.dismiss(proc.pid) and source.poll() == []
    assert not list(runtime.glob("*.sock"))  # the hook removed its socket on the way out
