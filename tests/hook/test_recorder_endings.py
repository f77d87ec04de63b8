"""How a recorded run ended: a crash on an uncaught exception (through the process's excepthook, the
user's own hook still called), a tracker left by an exception, a clean ``sys.exit``, and a live PID
that another process now has (the record keeps the process's start time; old records without it read
as before)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import anatomy
from anatomy import runs
from anatomy.protocol import Hello, Snapshot
from anatomy.recorder import SUFFIX, Recorder
from anatomy.run_ending import process_start

ROOT = Path(__file__).resolve().parents[2]

CRASHING = textwrap.dedent(
    """
    import sys, torch, anatomy
    if sys.argv[2] == "user-hook":  # the user's own excepthook, installed first: it must still run
        def mine(kind, value, tb):
            print(f"user hook saw {kind.__name__}: {value}", file=sys.stderr, flush=True)
        sys.excepthook = mine
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tracker = anatomy.track(model, opt, record=sys.argv[1], interval_s=0.05)
    x = torch.randn(4, 8)
    for step in range(30):
        with tracker.step(samples=4):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    raise ValueError("bad batch 30")
    """
)


@pytest.mark.parametrize("hook", ["user-hook", "default-hook"])
def test_an_uncaught_exception_ends_the_record_crashed(tmp_path: Path, hook: str) -> None:
    where = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ANATOMY_TOP_DIR": str(tmp_path / "rt")}
    done = subprocess.run(
        [sys.executable, "-c", CRASHING, str(where), hook],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 1
    if hook == "user-hook":  # called, and in place of the default (which it replaced)
        assert "user hook saw ValueError: bad batch 30" in done.stderr
        assert "Traceback" not in done.stderr
    else:
        assert "Traceback" in done.stderr and "ValueError: bad batch 30" in done.stderr
    run = runs.read_run(runs.record_files(where)[0])
    assert run.ended == "crashed" and run.error == "ValueError: bad batch 30"
    assert [r.step for r in run.rows] == list(range(30))  # every step before the crash
    assert run.header["version"] == 2


def _tiny() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _steps(tracker: anatomy.Tracker, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    for _ in range(5):
        with tracker.step(samples=2):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()


def test_a_tracker_left_by_an_exception_ends_crashed_and_a_clean_exit_finished(tmp_path: Path) -> None:
    model, opt = _tiny()
    crashed, exited = tmp_path / "crashed", tmp_path / "exited"
    with pytest.raises(RuntimeError), anatomy.track(model, opt, record=crashed, interval_s=0.05) as tracker:
        _steps(tracker, model, opt)
        raise RuntimeError("loss is nan")
    with pytest.raises(SystemExit), anatomy.track(model, opt, record=exited, interval_s=0.05) as tracker:
        _steps(tracker, model, opt)
        sys.exit(0)
    run = runs.read_run(runs.record_files(crashed)[0])
    assert run.ended == "crashed" and run.error == "RuntimeError: loss is nan"
    assert runs.list_runs(crashed)[0].to_json()["ended"] == "crashed"
    from tui.runreport import page  # the report names it (the monitor's side: no torch needed there)

    html = page.render(runs.resolve(str(run.path)))
    assert '<span class="badge crashed">crashed</span>' in html
    assert "crashed on <code>RuntimeError: loss is nan</code>" in html
    run = runs.read_run(runs.record_files(exited)[0])
    assert run.ended == "finished" and run.error is None


def _record(directory: Path, pid: int, header: dict[str, object]) -> Path:
    """A record without an end (its process killed, or still running) for ``pid`` on this host."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"20250101T000000Z-{socket.gethostname()}-{pid}{SUFFIX}"
    head = {"type": "record", "format": "anatomy-top-record", "created": 1.7e9, "pid": pid}
    rows = {"type": "steps", "rows": [[0, 1.7e9, 0.1, 100, None, None, None, None, 1]]}
    lines = [{**head, "host": socket.gethostname(), **header}, rows]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_a_live_pid_with_another_start_time_is_another_process(tmp_path: Path) -> None:
    me = os.getpid()
    started = process_start(me)
    assert started is not None and started == process_start()  # /proc/<pid>/stat field 22
    ours = _record(tmp_path / "a", me, {"version": 2, "proc_start": started})
    reused = _record(tmp_path / "b", me, {"version": 2, "proc_start": started + 1})
    unknown = _record(tmp_path / "c", me, {"version": 2, "proc_start": None})
    old = _record(tmp_path / "d", me, {"version": 1})  # a version 1 file: no start time kept
    assert runs.read_run(ours).ended == "running"
    assert runs.read_run(reused).ended == "killed"  # the PID lives on in another process
    assert runs.read_run(unknown).ended == "running"
    run = runs.read_run(old)
    assert run.ended == "running" and run.skipped == 0 and [r.step for r in run.rows] == [0]
    newer = _record(tmp_path / "e", me, {"version": 3})
    assert runs.read_run(newer).skipped == 1  # a header this reader does not know is not read as one


def test_pruning_keeps_a_running_process_and_drops_one_whose_pid_was_reused(tmp_path: Path) -> None:
    # The parent: alive, and not this process (whose own files pruning never touches).
    me, parent = os.getpid(), os.getppid()
    started = process_start(parent)
    assert started is not None
    running = _record(tmp_path, parent, {"version": 2, "proc_start": started})
    reused = running.with_name(running.name.replace("20250101T", "20240101T"))
    _record(tmp_path / "x", parent, {"version": 2, "proc_start": started + 7}).rename(reused)
    for path in (running, reused):
        with path.open("ab") as f:
            f.write(b"\n" * 100_000)
    recorder = Recorder(tmp_path, max_bytes=64 * 1024, max_total_bytes=150_000, snapshot_interval_s=0.0)
    hello = Hello(
        pid=me,
        host="box",
        device="cpu",
        precision="fp32",
        optimizer="sgd",
        model_class="Toy",
        parameter_count=10,
        torch_version="2",
        started_at=1.7e9,
    )
    snap = Snapshot(
        pid=me, seq=1, time=1.7e9, step=0, memory={}, expected_bytes_per_param={}, parameter_count=10
    )
    recorder.tick(hello, [snap])
    assert running.exists() and not reused.exists()
    assert recorder.path is not None and recorder.path.exists()
