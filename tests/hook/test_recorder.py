"""The flight recorder: a real training run's record, its bounds and thinning, an OOM, a SIGKILL mid-run,
a torn last record, a disk that refuses writes, and where it records (never the real home)."""

from __future__ import annotations

import errno
import gc
import itertools
import logging
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest
import torch

import anatomy
from anatomy import recorder as rec_mod
from anatomy import runs
from anatomy.protocol import Hello, Snapshot, Timing
from anatomy.recorder import MAX_RUN_BYTES, Recorder, record_dir

ROOT = Path(__file__).resolve().parents[2]


def _tiny() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _train(tracker: anatomy.Tracker, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    x = torch.randn(4, 8)
    for _ in range(steps):
        with tracker.step(samples=4):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()


def test_records_every_step_of_a_2000_step_run(tmp_path: Path) -> None:
    model, opt = _tiny()
    where = tmp_path / "runs"
    published: dict[int, Snapshot] = {}
    with anatomy.track(model, opt, record=where, interval_s=0.05) as tracker:
        x = torch.randn(4, 8)
        for _ in range(2000):
            with tracker.step(samples=4):
                model(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
            snap = tracker.latest
            assert snap is not None
            published[snap.step] = snap
    files = runs.record_files(where)
    assert len(files) == 1
    path = files[0]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(where.stat().st_mode) == 0o700
    assert path.stat().st_size <= MAX_RUN_BYTES
    run = runs.read_run(path)
    assert run.ended == "finished" and not run.torn and run.skipped == 0
    assert run.model_class == "Sequential" and run.pid == os.getpid()
    # Every published step is in the record with its own time and peak (nothing thinned at this size).
    assert [r.step for r in run.rows] == sorted(published)
    for row in run.rows:
        snap = published[row.step]
        assert row.n == 1 and row.peak_bytes == snap.peak_bytes
        assert row.step_s == pytest.approx(snap.timing.step_s, rel=1e-5)
    # Snapshots, at most one per interval, each exactly as published.
    assert len(run.snapshots) >= 2
    for snap in run.snapshots:
        assert snap == published[snap.step]
    assert run.snapshots[-1].step == max(published)  # the last one always
    assert run.hello is not None and run.hello.pid == os.getpid()


def _hello(**kw: object) -> Hello:
    base = dict(
        pid=os.getpid(),
        host="box",
        device="cpu",
        precision="fp32",
        optimizer="adamw",
        model_class="Toy",
        parameter_count=1000,
        torch_version="2",
        started_at=1_700_000_000.0,
    )
    base.update(kw)
    return Hello(**base)  # type: ignore[arg-type]


def _snap(step: int, peak: int, *, oom: str | None = None) -> Snapshot:
    return Snapshot(
        pid=os.getpid(),
        seq=step + 1,
        time=1_700_000_000.0 + step,
        step=step,
        memory={"weights": 4000, "activations": 1000 + step % 7},
        expected_bytes_per_param={"weights": 4.0},
        parameter_count=1000,
        peak_bytes=peak,
        timing=Timing(step_s=0.1 + (step % 10) / 100, forward_s=0.03, backward_s=0.06, optimizer_s=0.01),
        oom=oom,
    )


def test_thinned_history_keeps_the_whole_shape_within_the_budget(tmp_path: Path) -> None:
    budget = 256 * 1024
    recorder = Recorder(tmp_path, max_bytes=budget, snapshot_interval_s=0.0)
    hello = _hello()
    steps = 30_000
    spike = 1234  # one step's peak far above the rest: thinning must keep it (rows keep the largest)
    for start in range(0, steps, 10):
        batch = [_snap(s, 10_000 + (500_000 if s == spike else s % 100)) for s in range(start, start + 10)]
        if start == 20_000:
            hello = _hello(optimizer="sgd")  # a set-up change: an event, never thinned
        recorder.tick(hello, batch)
    recorder.tick(hello, [_snap(steps, 1, oom="CUDA out of memory")])
    recorder.close(hello, [])
    assert recorder.rewrites >= 1
    assert recorder.path is not None and recorder.path.stat().st_size <= budget
    run = runs.read_run(recorder.path)
    # Every step is accounted for, in contiguous rows: thinned rows stand for n steps each.
    assert sum(r.n for r in run.rows) == steps
    expected_first = 0
    for row in run.rows:
        assert row.step - row.n + 1 == expected_first
        expected_first = row.step + 1
    assert run.rows[0].n > 1  # the oldest history was thinned ...
    assert all(r.n == 1 for r in run.rows[-200:])  # ... the recent past is in full
    assert max(r.peak_bytes or 0 for r in run.rows) == 510_000  # the spike survives thinning
    spike_row = next(r for r in run.rows if r.step - r.n < spike <= r.step)
    assert spike_row.peak_bytes == 510_000
    # Snapshots are thinned too, but span the whole run; events all stay.
    assert run.snapshots[0].step < 2_000 and run.snapshots[-1].step == steps - 1
    assert [h.optimizer for _, _, h in run.hellos] == ["adamw", "sgd"]
    assert run.hellos[1][1] is not None and 19_990 <= run.hellos[1][1] < 20_000
    assert len(run.ooms) == 1 and run.ended == "oom"
    assert not list(tmp_path.glob("*.tmp"))


def _per_decile(steps: list[int], end: int) -> list[int]:
    counts = [0] * 10
    for s in steps:
        counts[min(s * 10 // end, 9)] += 1
    return counts


def test_many_rewrites_keep_the_old_history_even_in_steps(tmp_path: Path) -> None:
    budget = 512 * 1024
    recorder = Recorder(tmp_path, max_bytes=budget, snapshot_interval_s=0.0)
    hello = _hello()
    steps, per_tick = 40_000, 10  # a snapshot every 10 steps at full detail
    for start in range(0, steps, per_tick):
        recorder.tick(hello, [_snap(s, 10_000 + s % 100) for s in range(start, start + per_tick)])
    recorder.close(hello, [])
    assert recorder.rewrites >= 10  # the oldest history was thinned again and again
    assert recorder.path is not None and recorder.path.stat().st_size <= budget
    run = runs.read_run(recorder.path)
    snap_steps = [s.step for s in run.snapshots]
    assert snap_steps[0] < steps // 100 and snap_steps[-1] == steps - 1
    # The recent past in full: from the end back, a snapshot every tick; before it, the old history.
    recent = len(snap_steps) - 1
    while recent > 0 and snap_steps[recent] - snap_steps[recent - 1] == per_tick:
        recent -= 1
    old_end = snap_steps[recent]
    assert steps // 2 < old_end < steps - 20 * per_tick
    # The old history as an even grid in steps: every tenth of it holds about as many snapshots and
    # step rows as any other (thinning by position halved the oldest part again at every rewrite).
    old_snaps = _per_decile([s for s in snap_steps if s < old_end], old_end)
    old_rows = _per_decile([r.step for r in run.rows if r.step < old_end], old_end)
    for counts in (old_snaps, old_rows):
        mean = sum(counts) / 10
        assert mean >= 5 and min(counts) >= mean / 2 and max(counts) <= mean * 2, counts
    assert sum(r.n for r in run.rows) == steps
    # The report's memory chart covers the whole run, from its first steps on.
    from tui.runreport import page

    chart = page.memory_chart(run)
    xs = chart.stacked[0].xs
    assert xs[0] < steps // 100 and xs[-1] == steps - 1
    assert max(b - a for a, b in itertools.pairwise(xs)) < steps / 20


def test_the_record_in_memory_is_a_few_objects_however_long_the_run(tmp_path: Path) -> None:
    # What the recorder keeps to rewrite the file lives in the training process: row lists would be
    # tens of thousands of objects for every full garbage collection to walk, and ~300 bytes a step.
    recorder = Recorder(tmp_path, snapshot_interval_s=1e9)  # one snapshot, then step rows only
    hello = _hello()

    def record(first: int, last: int) -> None:
        for start in range(first, last, 10):
            recorder.tick(hello, [_snap(s, 10_000 + s) for s in range(start, start + 10)])

    record(0, 1_000)
    gc.collect()
    objects = len(gc.get_objects())
    tracemalloc.start()
    try:
        record(1_000, 11_000)
        gc.collect()
        grown, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(gc.get_objects()) - objects < 100
    assert grown / 10_000 < 120  # bytes a step: nine 8-byte columns and a little bookkeeping
    assert recorder.rewrites == 0 and recorder.path is not None
    assert [r.step for r in runs.read_run(recorder.path).rows] == list(range(11_000))


def test_a_rewrite_does_not_trust_a_file_changed_behind_its_back(tmp_path: Path) -> None:
    # A rewrite copies the lines that stay from the file; a file that is not what was written (here a
    # line appended by someone else) is written afresh from what the recorder holds.
    recorder = Recorder(tmp_path, max_bytes=64 * 1024, snapshot_interval_s=0.0)
    hello = _hello()
    recorder.tick(hello, [_snap(s, 100 + s) for s in range(10)])
    assert recorder.path is not None
    with open(recorder.path, "ab") as other:
        other.write(b'{"type":"steps","rows":[[999999,1,1,1,1,1,1,1,1]]}\n')
    for start in range(10, 3_000, 10):
        recorder.tick(hello, [_snap(s, 100 + s) for s in range(start, start + 10)])
    recorder.close(hello, [])
    assert recorder.rewrites >= 1
    run = runs.read_run(recorder.path)
    assert run.skipped == 0 and run.ended == "finished"
    assert run.rows[-1].step == 2_999 and sum(r.n for r in run.rows) == 3_000


def test_a_torn_last_record_is_skipped_and_nothing_before_it_lost(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path, snapshot_interval_s=0.0)
    hello = _hello()
    for s in range(50):
        recorder.tick(hello, [_snap(s, 100)])
    assert recorder.path is not None
    whole = recorder.path.read_bytes()
    complete = runs.read_run(recorder.path)
    assert [r.step for r in complete.rows] == list(range(50))
    last_line_start = whole.rstrip(b"\n").rfind(b"\n") + 1
    for cut in range(last_line_start + 1, len(whole)):  # every place a kill can tear the last record
        recorder.path.write_bytes(whole[:cut])
        run = runs.read_run(recorder.path)
        assert run.torn and run.skipped == 1
        assert [r.step for r in run.rows] == list(range(49)) or [r.step for r in run.rows] == list(range(50))
        assert len(run.snapshots) >= 48


KILLED = textwrap.dedent(
    """
    import sys, torch, anatomy
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tracker = anatomy.track(model, opt, record=sys.argv[1], interval_s=0.05)
    x = torch.randn(4, 8)
    while True:
        with tracker.step(samples=4):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        print(tracker.latest.step, flush=True)
    """
)


def test_sigkill_mid_run_keeps_every_step_recorded_before_it(tmp_path: Path) -> None:
    where = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ANATOMY_TOP_DIR": str(tmp_path / "rt")}
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(where)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    seen: list[tuple[float, int]] = []
    kill_at = time.monotonic() + 120
    try:
        while time.monotonic() < kill_at:  # train on for a second past step 200, then kill
            line = child.stdout.readline()
            if not line:
                break
            seen.append((time.monotonic(), int(line)))
            if seen[-1][1] == 200:
                kill_at = time.monotonic() + 1.0
    finally:
        os.kill(child.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        child.wait(timeout=30)
    assert seen and seen[-1][1] > 200, "the child never got past step 200"
    files = runs.record_files(where)
    assert len(files) == 1
    run = runs.read_run(files[0])
    assert run.ended == "killed" and run.end is None
    steps = [r.step for r in run.rows]
    assert steps == list(range(len(steps)))  # from step 0, no gap
    # Everything finished well before the kill (a few publish intervals) is in the record.
    settled = [s for t, s in seen if t < killed_at - 0.5]
    assert settled and steps[-1] >= settled[-1]


def test_a_simulated_oom_is_recorded_with_the_steps_before_it(tmp_path: Path) -> None:
    model, opt = _tiny()
    where = tmp_path / "runs"
    tracker = anatomy.track(model, opt, record=where, interval_s=0.05)
    _train(tracker, model, opt, 30)
    with pytest.raises(torch.OutOfMemoryError), tracker.step():
        model(torch.randn(4, 8)).sum().backward()
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    tracker.close()
    run = runs.read_run(runs.record_files(where)[0])
    assert run.ended == "oom"
    assert len(run.ooms) == 1 and "Tried to allocate 20.00 GiB" in (run.ooms[0].oom or "")
    assert [r.step for r in run.rows][:30] == list(range(30))
    # The report shows the OOM and the steps that led to it (the monitor's side: no torch needed there).
    from tui.runreport import page

    html = page.render(runs.resolve(str(run.path)))
    oom_step = run.ooms[0].step
    assert f"out of memory at step {oom_step}" in html and "Tried to allocate 20.00 GiB" in html
    lead = html[html.index("The steps that led to it") :]
    shown = [int(s) for s in re.findall(r"<tr><td class=num>(\d+)</td>", lead)]
    assert shown == [s for s in range(30) if s < oom_step][-20:]


@pytest.mark.parametrize(
    ("code", "why"), [(errno.ENOSPC, "the disk is full"), (errno.EROFS, "the disk is read-only")]
)
def test_a_disk_that_refuses_writes_turns_recording_off_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, code: int, why: str
) -> None:
    recorder = Recorder(tmp_path, snapshot_interval_s=0.0)
    hello = _hello()
    recorder.tick(hello, [_snap(0, 1)])
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(rec_mod.os, "write", full)
    with caplog.at_level(logging.WARNING, logger="anatomy"):
        for s in range(1, 20):
            recorder.tick(hello, [_snap(s, 1)])  # never raises
        recorder.close(hello, [])
    monkeypatch.setattr(rec_mod.os, "write", real_write)
    assert recorder.off
    lines = [r.getMessage() for r in caplog.records if "recording stopped" in r.getMessage()]
    assert lines == [f"anatomy-top: recording stopped ({why}); training and publishing go on"]
    assert recorder.path is not None and [r.step for r in runs.read_run(recorder.path).rows] == [0]


def test_a_read_only_disk_turns_recording_off_and_leaves_training_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A read-only mount: the record directory is there (made earlier), creating a file in it fails
    # with EROFS (injected at os.open for paths in it: the tests run as root, whom chmod does not stop).
    where = tmp_path / "runs"
    where.mkdir(mode=0o700)
    real_open = os.open

    def read_only(path: str | os.PathLike[str], flags: int, *args: object, **kw: object) -> int:
        if str(path).startswith(str(where)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", read_only)
    reference, ref_opt = _tiny()
    _train_plain(reference, ref_opt, 40)
    model, opt = _tiny()
    with caplog.at_level(logging.WARNING, logger="anatomy"):
        with anatomy.track(model, opt, record=where, interval_s=0.05) as tracker:
            _train(tracker, model, opt, 40)
            time.sleep(0.2)  # a few publish intervals: the recorder tries, and stops
            assert tracker.socket_path is not None and tracker.latest is not None  # still published
            assert tracker.latest.step == 39
        assert tracker.error is None
    lines = [r.getMessage() for r in caplog.records if "recording stopped" in r.getMessage()]
    assert lines == ["anatomy-top: recording stopped (the disk is read-only); training and publishing go on"]
    assert list(where.iterdir()) == []
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(mine, theirs)  # the same training, step for step


def _train_plain(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    x = torch.randn(4, 8)
    for _ in range(steps):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def test_an_unusable_record_directory_leaves_training_untouched(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    model, opt = _tiny()
    with caplog.at_level(logging.WARNING, logger="anatomy"):
        with anatomy.track(model, opt, record=blocker / "runs", interval_s=0.05) as tracker:
            _train(tracker, model, opt, 20)
            time.sleep(0.2)
            assert tracker.socket_path is not None and tracker.latest is not None
        assert tracker.error is None
    assert len([r for r in caplog.records if "recording stopped" in r.getMessage()]) == 1


def test_a_socket_that_cannot_be_opened_does_not_lose_the_history(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # the socket's directory cannot be made under it
    where = tmp_path / "runs"
    model, opt = _tiny()
    sockets = blocker / "sockets"
    with caplog.at_level(logging.WARNING, logger="anatomy"):
        tracker = anatomy.track(model, opt, record=where, directory=sockets, interval_s=0.05)
        _train(tracker, model, opt, 30)
        assert tracker.socket_path is None  # nothing published ...
        tracker.close()
    assert any("publisher could not start" in r.getMessage() for r in caplog.records)
    run = runs.read_run(runs.record_files(where)[0])  # ... and everything recorded
    assert run.ended == "finished" and [r.step for r in run.rows] == list(range(30))
    assert run.snapshots and run.snapshots[-1].step == 29 and run.model_class == "Sequential"


def test_publish_false_records_only_when_record_is_asked_for_in_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(tmp_path / "rt"))
    monkeypatch.setenv("ANATOMY_TOP_RECORD", str(tmp_path / "from-env"))
    model, opt = _tiny()
    with anatomy.track(model, opt, publish=False, interval_s=0.05) as tracker:
        _train(tracker, model, opt, 5)
    assert not (tmp_path / "from-env").exists()  # publish=False alone: no record, whatever the env
    where = tmp_path / "asked"
    tracker = anatomy.track(model, opt, publish=False, record=where, interval_s=0.05)
    _train(tracker, model, opt, 12)
    with pytest.raises(torch.OutOfMemoryError), tracker.step():
        model(torch.randn(4, 8)).sum().backward()
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
    tracker.close()
    assert tracker.socket_path is None and not (tmp_path / "rt").exists()  # nothing published
    run = runs.read_run(runs.record_files(where)[0])
    assert [r.step for r in run.rows][:12] == list(range(12))
    assert run.ended == "oom" and "Tried to allocate 1.00 GiB" in (run.ooms[0].oom or "")


def test_where_it_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = Path(os.environ["XDG_STATE_HOME"])
    assert not str(state).startswith(str(Path.home() / ".local"))  # tests never record into the home
    assert record_dir() == state / "anatomy-top" / "runs"
    monkeypatch.setenv("ANATOMY_TOP_RECORD", "0")
    assert record_dir() is None and record_dir(True) is not None
    assert record_dir(tmp_path) == tmp_path  # in code, a path wins
    monkeypatch.setenv("ANATOMY_TOP_RECORD", str(tmp_path / "elsewhere"))
    assert record_dir() == tmp_path / "elsewhere"
    assert record_dir(False) is None
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.delenv("ANATOMY_TOP_RECORD")
    assert record_dir() == Path.home() / ".local" / "state" / "anatomy-top" / "runs"


def test_record_off_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANATOMY_TOP_RECORD", "0")
    model, opt = _tiny()
    with anatomy.track(model, opt, interval_s=0.05) as tracker:
        _train(tracker, model, opt, 5)
    state = Path(os.environ["XDG_STATE_HOME"])
    assert not (state / "anatomy-top").exists()


def test_old_runs_are_pruned_oldest_first(tmp_path: Path) -> None:
    dead = 2**22 + 12345  # beyond pid_max: no live process
    old = []
    for i in range(4):
        p = tmp_path / f"2020010{i}T000000Z-box-{dead + i}{rec_mod.SUFFIX}"
        p.write_bytes(b"x" * 100_000)
        os.utime(p, (1_600_000_000 + i, 1_600_000_000 + i))
        old.append(p)
    recorder = Recorder(tmp_path, max_bytes=100_000, max_total_bytes=300_000, snapshot_interval_s=0.0)
    recorder.tick(_hello(), [_snap(0, 1)])
    assert [p.exists() for p in old] == [False, False, True, True]
    assert recorder.path is not None and recorder.path.exists()
