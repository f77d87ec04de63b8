"""The step feed: finished steps as raw rows, made into snapshots only when read, taken by the flight
recorder as columns; a reader the writer laps loses rows, never reads one torn."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from anatomy.protocol import Snapshot, Timing
from anatomy.record_log import rows_line
from anatomy.recorder import Recorder, feed_rows, step_row
from anatomy.step_feed import CAPACITY, FeedHistory, StepFeed
from anatomy.vocabulary import Component


def _built(step: int, seq: int, peak: int | None = 1000) -> Snapshot:
    return Snapshot(
        pid=1,
        seq=seq,
        time=100.0 + step,
        step=step,
        memory={Component.WEIGHTS: 64},
        expected_bytes_per_param={},
        parameter_count=16,
        peak_bytes=peak,
        timing=Timing(step_s=0.5, forward_s=0.1),
    )


def _timing(step_s: float) -> Timing:
    return Timing(
        step_s=step_s, forward_s=step_s / 4, backward_s=None, optimizer_s=step_s / 8, samples_per_s=8 / step_s
    )


def test_a_repeated_row_is_the_built_snapshot_with_its_own_step_time_and_timing() -> None:
    feed = StepFeed()
    assert feed.latest() is None
    base = _built(0, seq=1)
    feed.put_built(base)
    assert feed.latest() is base  # a built row is its own snapshot
    feed.put(base, 2, 200.25, 1, _timing(0.25))
    snap = feed.latest()
    assert snap is not None and snap is feed.latest()  # made once, then kept
    assert (snap.seq, snap.time, snap.step) == (2, 200.25, 1)
    assert snap.timing == _timing(0.25)
    assert snap.memory is base.memory  # everything else is the base's
    rest = {f.name for f in dataclasses.fields(Snapshot)} - {"seq", "time", "step", "timing"}
    assert all(getattr(snap, name) == getattr(base, name) for name in rest)
    assert feed.snapshot(0) is base and feed.snapshot(2) is None


def test_a_step_built_again_replaces_its_row() -> None:
    feed = StepFeed()
    base = _built(0, seq=1)
    feed.put_built(base)
    feed.put(base, 2, 201.0, 1, _timing(0.25))
    again = _built(1, seq=3)
    feed.put_built(again, replace=True)
    assert feed.written == 2 and feed.latest() is again
    other = _built(2, seq=4)
    feed.put_built(other, replace=True)  # another step: a row of its own
    assert feed.written == 3 and feed.latest() is other


def test_rows_since_a_cursor_wrap_around_the_ring_and_a_lapped_reader_loses_the_oldest() -> None:
    feed = StepFeed()
    base = _built(0, seq=0)
    for k in range(CAPACITY - 3):
        feed.put(base, k + 1, 300.0 + k, k, _timing(0.125))
    got, cursor = feed.rows_since(0)
    assert got.count == CAPACITY - 3 and got.lost == 0 and cursor == CAPACITY - 3
    assert list(got.column(0)) == [float(k) for k in range(CAPACITY - 3)]
    for k in range(CAPACITY - 3, CAPACITY + 10):  # past the ring's end
        feed.put(base, k + 1, 300.0 + k, k, _timing(0.125))
    got, cursor = feed.rows_since(cursor)
    assert got.count == 13 and got.lost == 0 and cursor == CAPACITY + 10
    assert list(got.column(0)) == [float(k) for k in range(CAPACITY - 3, CAPACITY + 10)]
    for k in range(CAPACITY + 10, 3 * CAPACITY):  # a reader held up for more than the ring
        feed.put(base, k + 1, 300.0 + k, k, _timing(0.125))
    got, cursor = feed.rows_since(cursor)
    assert got.count == CAPACITY - 1 and got.lost == 3 * CAPACITY - (CAPACITY + 10) - (CAPACITY - 1)
    assert got.column(0)[0] == float(2 * CAPACITY + 1) and got.column(0)[-1] == float(3 * CAPACITY - 1)


def test_a_row_the_writer_reuses_while_it_is_copied_is_dropped() -> None:
    """The writer laps the reader while the reader copies (between its two looks at ``written``): the rows
    whose slots it reused (and the one it may be writing) are dropped, the others kept whole."""
    feed = StepFeed()
    base = _built(0, seq=0)
    for k in range(10):
        feed.put(base, k + 1, 0.0, k, _timing(0.5))
    values = feed.values

    class Racing:
        """The ring's values; copying them lets the writer put CAPACITY - 6 more rows first."""

        def __getitem__(self, index: slice) -> object:
            feed.values = values
            for k in range(10, CAPACITY + 4):  # rows CAPACITY..CAPACITY+3 take slots 0..3
                feed.put(base, k + 1, 0.0, k, _timing(0.5))
            return values[index]

    feed.values = Racing()  # type: ignore[assignment]
    got, cursor = feed.rows_since(0)
    assert cursor == 10 and got.lost == 5 and got.count == 5
    assert list(got.column(0)) == [5.0, 6.0, 7.0, 8.0, 9.0]


def test_the_history_shows_the_last_steps_oldest_first() -> None:
    feed = StepFeed()
    history = FeedHistory(feed, 4)
    assert len(history) == 0 and not history and list(history) == []
    base = _built(0, seq=1)
    feed.put_built(base)
    for k in range(1, 7):
        feed.put(base, k + 1, 100.0 + k, k, _timing(0.5))
    assert len(history) == 4
    assert [s.step for s in history] == [3, 4, 5, 6]
    assert history[0].step == 3 and history[-1].step == 6 and history[-4].step == 3
    assert [s.step for s in history[1:3]] == [4, 5]
    with pytest.raises(IndexError):
        history[4]


def test_the_recorders_rows_are_the_rows_it_wrote_before() -> None:
    """The steps line the recorder writes from the feed's columns holds the values the old per-snapshot
    rows (``step_row``) of the same steps held — rounded the same, null where not measured — and the
    columns it keeps are those values."""
    feed = StepFeed()
    base = _built(0, seq=1, peak=None)
    feed.put_built(base)
    feed.put(base, 2, 1234.56789, 1, Timing(step_s=0.0123456789, backward_s=0.002, samples_per_s=None))
    feed.put(base, 3, 1235.5, 2, _timing(1 / 3))
    feed.put(base, 4, 1236.0, 3, _timing(1e-6))
    got, _ = feed.rows_since(0)
    columns, line = feed_rows(got)
    ours = json.loads(line)
    assert ours["type"] == "steps" and line.endswith(b"\n")
    snaps = [feed.snapshot(k) for k in range(4)]
    theirs = json.loads(rows_line([step_row(s) for s in snaps if s is not None]))["rows"]
    assert ours["rows"] == theirs  # (JSON numbers: 1e-06 and 1.0e-06, 100 and 100.0 are one value)
    assert ours["rows"][1][:3] == [1, 1234.568, 0.0123457] and ours["rows"][1][3] is None
    assert ours["rows"][1][7] is None and ours["rows"][3][2] == 1e-06
    assert list(columns[0]) == [0, 1, 2, 3] and list(columns[3]) == [-1] * 4 and list(columns[8]) == [1] * 4
    assert math.isnan(columns[4][1]) and columns[2][1] == 0.0123457  # NaN kept in the float column


def test_a_recorder_following_a_feed_writes_every_row_once(tmp_path: Path) -> None:
    from anatomy import runs
    from anatomy.protocol import Hello

    hello = Hello(
        pid=12345, host="h", device="cpu", precision="fp32", optimizer="adamw", model_class="M",
        parameter_count=16, torch_version="2", started_at=1.0,
    )  # fmt: skip
    feed = StepFeed()
    rec = Recorder(tmp_path, snapshot_interval_s=0.0)
    rec.follow(feed)
    base = _built(0, seq=1)
    feed.put_built(base)
    for k in range(1, 50):
        feed.put(base, k + 1, 100.0 + k, k, _timing(0.5))
        if k % 7 == 0:
            rec.tick(hello, [])
    rec.close(hello, [])
    files = runs.record_files(tmp_path)
    run = runs.read_run(files[0])
    assert [r.step for r in run.rows] == list(range(50))
    assert all(r.peak_bytes == 1000 and r.n == 1 for r in run.rows)
    assert run.snapshots[-1].step == 49 and run.ended == "finished"


def test_a_row_without_a_forward_split_shows_the_last_builds_and_the_record_keeps_it_unmeasured() -> None:
    """A step whose forward ran unwatched (the hook's forward hooks resting) has neither a forward nor a
    backward time: its snapshot shows those of the step built last, the record keeps null. A row with one of
    the two keeps its own."""
    feed = StepFeed()
    base = _built(0, seq=1)
    feed.put_built(base)
    feed.put(base, 2, 101.0, 1, Timing(step_s=0.25, optimizer_s=0.05, samples_per_s=32.0))
    feed.put(base, 3, 102.0, 2, Timing(step_s=0.25, backward_s=0.125))
    unwatched, own = feed.snapshot(1), feed.snapshot(2)
    assert unwatched is not None and own is not None
    assert unwatched.timing == Timing(step_s=0.25, forward_s=0.1, optimizer_s=0.05, samples_per_s=32.0)
    assert own.timing == Timing(step_s=0.25, backward_s=0.125)
    got, _ = feed.rows_since(0)
    _, line = feed_rows(got)
    rows = json.loads(line)["rows"]
    assert rows[1][4:6] == [None, None] and rows[2][4:6] == [None, 0.125]


def test_an_unwatched_steps_split_is_the_builds_scaled_to_its_time_outside_the_optimizer() -> None:
    """The build was a step that looked (its forward slower for it): its forward and backward take this
    step's share outside the optimizer in the same proportion, so the three never exceed the step."""
    feed = StepFeed()
    base = dataclasses.replace(
        _built(0, seq=1), timing=Timing(step_s=0.5, forward_s=0.1, backward_s=0.2, optimizer_s=0.1)
    )
    feed.put_built(base)
    feed.put(base, 2, 101.0, 1, Timing(step_s=0.3, optimizer_s=0.1))
    snap = feed.snapshot(1)
    assert snap is not None and snap.timing.forward_s is not None and snap.timing.backward_s is not None
    # outside the optimizer: 0.2 s here against 0.4 s in the build
    assert snap.timing.forward_s == pytest.approx(0.05) and snap.timing.backward_s == pytest.approx(0.1)
    assert snap.timing.forward_s + snap.timing.backward_s + 0.1 <= 0.3 + 1e-12


def test_a_row_that_timed_neither_phase_shows_the_builds_three_scaled_to_its_step() -> None:
    """A resting step's update ran under no hook of ours: its row has the step's time alone, and its
    snapshot the build's forward, backward and optimizer times, each scaled by the two steps' times (they
    add up as the build's did); the record keeps all three null."""
    feed = StepFeed()
    base = dataclasses.replace(
        _built(0, seq=1), timing=Timing(step_s=0.5, forward_s=0.1, backward_s=0.2, optimizer_s=0.1)
    )
    feed.put_built(base)
    feed.put(base, 2, 101.0, 1, Timing(step_s=0.25, samples_per_s=32.0))
    snap = feed.snapshot(1)
    assert snap is not None
    t = snap.timing
    assert t.forward_s == pytest.approx(0.05) and t.backward_s == pytest.approx(0.1)
    assert t.optimizer_s == pytest.approx(0.05) and t.samples_per_s == 32.0
    got, _ = feed.rows_since(0)
    _, line = feed_rows(got)
    assert json.loads(line)["rows"][1][4:7] == [None, None, None]
