"""``anatomy-top --replay`` (the anatomy pane over a recorded run) and live charts that reach back to the
run's start through its flight record (a real publisher and recorder; no torch)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from textual.widgets import Sparkline

from anatomy import runs
from anatomy.protocol.publisher import Publisher
from anatomy.recorder import Recorder
from tui.replay import ReplayApp
from tui.sources.anatomy_source import LIVE, AnatomySource
from tui.sources.run_history import RunHistories
from tui.widgets.anatomy_pane import AnatomyPane

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import synth_record  # noqa: E402


async def test_replay_moves_through_the_recorded_steps(tmp_path: Path) -> None:
    synth_record.synthesize(tmp_path, 400, pid=77, oom=True)
    group = runs.resolve("last", tmp_path)
    app = ReplayApp(group)
    async with app.run_test(size=(120, 60)) as pilot:
        await pilot.pause()
        pane = app.query_one(AnatomyPane)
        assert pane.process is not None and pane.process.state == "oom"  # opens at the end: the OOM
        assert pane.process.snapshot is not None and pane.process.snapshot.step == 400
        status = str(app.query_one("#replay-status").render())
        assert "step 400" in status and "oom" in status
        await pilot.press("left")
        before_oom = pane.process.snapshot
        assert before_oom is not None and before_oom.step == group.first.snapshots[-1].step < 400
        assert pane.process.state == "exited"
        await pilot.press("home")
        assert pane.process.snapshot == group.first.snapshots[0]
        assert pane.process.hello is not None and pane.process.hello.optimizer == "adamw"
        await pilot.press("pagedown", "pagedown", "pagedown", "pagedown", "pagedown")
        later = pane.process.snapshot
        assert later is not None and later.step > 160
        assert pane.process.hello.optimizer == "adafactor"  # the set-up change at step 160 applies
        # The sparklines are the whole run: every step's peak, whatever the step shown.
        spark = app.query_one("#spark-memory", Sparkline)
        assert len(list(spark.data or [])) == len([r for r in group.first.rows if r.peak_bytes is not None])


async def test_replay_of_a_job_switches_ranks_at_the_same_step(tmp_path: Path) -> None:
    synth_record.synthesize(tmp_path, 300, pid=10, rank=0, world=2)
    synth_record.synthesize(tmp_path, 300, pid=11, rank=1, world=2, slow=1.3)
    group = runs.resolve("last", tmp_path)
    assert len(group.runs) == 2
    app = ReplayApp(group)
    async with app.run_test(size=(120, 60)) as pilot:
        await pilot.pause()
        await pilot.press("home", "pagedown")
        pane = app.query_one(AnatomyPane)
        assert pane.process is not None and pane.process.pid == 10
        step = pane.process.snapshot.step if pane.process.snapshot else -1
        await pilot.press("tab")
        assert pane.process.pid == 11 and pane.process.snapshot is not None
        assert abs(pane.process.snapshot.step - step) <= 5  # the nearest recorded snapshot
        assert "rank 1 (2 of 2)" in str(app.query_one("#replay-status").render())


def test_a_live_process_history_reaches_back_to_its_start(tmp_path: Path) -> None:
    runtime, records = tmp_path / "rt", tmp_path / "runs"
    hello = replace(synth_record.hello(os.getpid(), time.time()), host=os.uname().nodename)
    publisher = Publisher(hello, interval_s=0.02, directory=runtime, recorder=Recorder(records))
    assert publisher.start() is not None
    try:
        for step in range(300):  # published before any monitor looks
            publisher.publish(synth_record.snapshot(os.getpid(), hello.started_at, step, 300))
            if step % 50 == 0:
                time.sleep(0.05)
        time.sleep(0.3)  # the publisher's thread hands the last steps to the recorder
        histories = RunHistories(records, refresh_s=0.0)
        with AnatomySource(runtime, histories=histories) as source:
            procs = source.poll(wait_for_first_s=2.0)
            (proc,) = [p for p in procs if p.pid == os.getpid()]
            assert proc.state == LIVE
            # The monitor saw one snapshot; its charts hold all 300 steps from the record.
            assert len(proc.memory_history) == 300 and len(proc.step_time_history) == 300
            expected = [
                synth_record.snapshot(os.getpid(), hello.started_at, s, 300).peak_bytes for s in range(300)
            ]
            assert list(proc.memory_history) == expected
            for step in range(300, 350):  # the record is followed as it grows
                publisher.publish(synth_record.snapshot(os.getpid(), hello.started_at, step, 350))
            time.sleep(0.3)
            (proc,) = [p for p in source.poll() if p.pid == os.getpid()]
            assert len(proc.memory_history) == 350
        without = AnatomySource(runtime)  # no records followed: only what it saw itself
        try:
            (proc,) = [p for p in without.poll(wait_for_first_s=2.0) if p.pid == os.getpid()]
            assert len(proc.memory_history) == 1
        finally:
            without.close()
    finally:
        publisher.close()


def test_a_rewritten_record_is_followed_from_its_new_start(tmp_path: Path) -> None:
    hello = synth_record.hello(4242, time.time())
    recorder = Recorder(tmp_path, max_bytes=128 * 1024, snapshot_interval_s=0.0)
    histories = RunHistories(tmp_path, refresh_s=0.0)
    seen = []
    for start in range(0, 3000, 5):
        batch = [synth_record.snapshot(4242, hello.started_at, s, 3000) for s in range(start, start + 5)]
        recorder.tick(hello, batch)
        if start % 500 == 0:
            found = histories.lookup(hello)
            assert found is not None
            seen.append(found)
    assert recorder.rewrites >= 1
    final = histories.lookup(hello)
    assert final is not None and final.first_step == 0  # the thinned history still starts at step 0
    assert max(final.peaks) == max(
        synth_record.snapshot(4242, hello.started_at, s, 3000).peak_bytes or 0 for s in range(3000)
    )


def test_no_record_means_no_history_from_it(tmp_path: Path) -> None:
    histories = RunHistories(tmp_path, refresh_s=0.0)
    assert histories.lookup(synth_record.hello(999, time.time())) is None
    synth_record.synthesize(tmp_path, 20, pid=999)  # another run of that PID (a recycled one): not it
    assert RunHistories(tmp_path, refresh_s=0.0).lookup(synth_record.hello(999, time.time() - 86400)) is None
