"""The whole-run sparklines (the replay's, and the live monitor's from a running job's record) cut the run
into columns of equal step ranges, however the recorder thinned it: its recent past kept in full, its
older history merged on a step grid. Grouping the kept rows by count gave the dense recent part far more
of a sparkline than its share of the steps."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import Sparkline

from anatomy import runs
from anatomy.protocol import Hello, Snapshot, Timing
from anatomy.recorder import Recorder
from tui.replay import POINTS, ReplayApp, whole_run
from tui.sources.run_history import RecordTail, RunHistories
from tui.step_buckets import MAX, MEAN, buckets, even_series

STEPS = 1 << 15  # a power of two: the recorder's grid cells (powers of two) never straddle the middle
LOW, HIGH = 1_000_000, 5_000_000  # the peak steps up at half the run's steps


def _hello() -> Hello:
    return Hello(
        pid=os.getpid(),
        host=os.uname().nodename,
        device="cpu",
        precision="fp32",
        optimizer="adamw",
        model_class="Toy",
        parameter_count=1000,
        torch_version="2",
        started_at=1_700_000_000.0,
    )


def _snap(step: int) -> Snapshot:
    return Snapshot(
        pid=os.getpid(),
        seq=step + 1,
        time=1_700_000_000.0 + step,
        step=step,
        memory={"weights": 4000},
        expected_bytes_per_param={"weights": 4.0},
        parameter_count=1000,
        peak_bytes=LOW if step < STEPS // 2 else HIGH,
        timing=Timing(step_s=step / STEPS),  # a ramp: a column's mean time says which steps it holds
    )


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A long run through the real recorder with a small budget: thinned again and again."""
    directory = tmp_path_factory.mktemp("runs")
    recorder = Recorder(directory, max_bytes=256 * 1024, snapshot_interval_s=0.0)
    hello = _hello()
    for start in range(0, STEPS, 16):
        recorder.tick(hello, [_snap(s) for s in range(start, start + 16)])
    recorder.close(hello, [])
    assert recorder.rewrites >= 10 and recorder.path is not None
    return recorder.path


def _assert_even_columns(peaks: tuple[int, ...], times: tuple[float, ...], widest_row: int) -> None:
    assert len(peaks) == len(times) == POINTS
    # The step-up at half the steps is in the middle column, not where half the kept rows end.
    assert set(peaks[: POINTS // 2]) == {LOW} and set(peaks[POINTS // 2 :]) == {HIGH}
    # Column c stands for steps c/POINTS .. (c+1)/POINTS of the run: on a ramp, its mean time is its
    # middle step's, give or take half the widest thinned row (a row's mean is over all its steps).
    width = STEPS / POINTS
    for c, t in enumerate(times):
        middle = (c + 0.5) * width - 0.5
        assert abs(t * STEPS - middle) <= widest_row / 2 + 1, (c, t * STEPS, middle)


def test_the_record_is_uneven_in_rows_per_step(record: Path) -> None:
    """What made counting rows wrong: most kept rows are the recent past's."""
    rows = runs.read_run(record).rows
    assert sum(r.n for r in rows) == STEPS and rows[0].n > 1 and rows[-1].n == 1
    first_high = next(i for i, r in enumerate(rows) if r.peak_bytes == HIGH)
    assert first_high / len(rows) < 0.3  # by count, the step-up would show in the first third
    assert sum(1 for r in rows if r.step >= STEPS * 0.9) / len(rows) > 0.5  # the last tenth: most rows


def test_the_replay_sparklines_cover_equal_step_ranges(record: Path) -> None:
    run = runs.read_run(record)
    peaks, times = whole_run(run)
    _assert_even_columns(peaks, times, max(r.n for r in run.rows))


def test_the_live_history_from_a_record_covers_equal_step_ranges(record: Path) -> None:
    found = RunHistories(record.parent, refresh_s=0.0).lookup(_hello())
    assert found is not None and found.first_step == 0
    _assert_even_columns(found.peaks, found.step_times, max(r.n for r in runs.read_run(record).rows))


def test_the_live_history_stays_even_when_it_merges_rows(record: Path) -> None:
    rows = runs.read_run(record).rows
    tail = RecordTail(record, max_rows=len(rows) // 2)
    tail.poll()
    history = tail.history()
    # Neighbours merged in pairs (a recent row with an old one's end: their ranges differ) still count
    # for the steps they stand for.
    assert len(history.peaks) == POINTS and max(history.peaks) == HIGH
    first_high = history.peaks.index(HIGH)
    assert POINTS // 2 - 1 <= first_high <= POINTS // 2
    assert set(history.peaks[first_high:]) == {HIGH} and set(history.peaks[:first_high]) == {LOW}
    width = STEPS / POINTS
    widest = 2 * max(r.n for r in rows)
    for c, t in enumerate(history.step_times):
        assert abs(t * STEPS - ((c + 0.5) * width - 0.5)) <= widest / 2 + 1


async def test_the_replay_pane_shows_the_step_up_in_its_middle_column(record: Path) -> None:
    app = ReplayApp(runs.resolve(str(record), record.parent))
    async with app.run_test(size=(120, 60)) as pilot:
        await pilot.pause()
        spark = app.query_one("#spark-memory", Sparkline)
        width = spark.size.width
        assert width >= 20
        out = io.StringIO()
        Console(file=out, width=width, color_system=None, legacy_windows=False).print(spark.render())
        bottom = out.getvalue().rstrip("\n").split("\n")[-1]
        assert len(bottom) == width and set(bottom) == {"▁", "█"}
        first_high = bottom.index("█")
        assert abs(first_high - width / 2) <= 1, bottom
        assert set(bottom[first_high:]) == {"█"}


def _per_step(rows: list[tuple[int, int, float]]) -> dict[int, float]:
    return {s: y for first, last, y in rows for s in range(first, last + 1)}


@pytest.mark.parametrize("n", [7, 40, 333])
def test_buckets_summarise_the_steps_in_their_range(n: int) -> None:
    """Against every step expanded from its row: each bucket's largest and step-weighted mean."""
    rng = random.Random(n)
    rows, step = [], 0
    for width in [64] * 20 + [8] * 30 + [1] * 400:  # an old history thinned, then the recent past
        rows.append((step, step + width - 1, rng.uniform(0, 10)))
        step += width
    steps = _per_step(rows)
    lo, hi = 0, step - 1
    xs, firsts, ys = [r[1] for r in rows], [r[0] for r in rows], [r[2] for r in rows]
    for how in (MAX, MEAN):
        got = buckets(xs, ys, n, how, firsts)
        assert len(got) == n and got[0].start == lo and got[-1].end == hi
        for k, bucket in enumerate(got):
            inside = [y for s, y in steps.items() if min(int((s - lo) * n / (hi - lo)), n - 1) == k]
            want = max(inside) if how == MAX else sum(inside) / len(inside)
            assert bucket.value == pytest.approx(want, rel=1e-9), (how, k)
            assert bucket.end - bucket.start == pytest.approx((hi - lo) / n)


def test_even_series_carries_a_gap_and_keeps_a_short_run_whole() -> None:
    # A short run in full: one value per step, as recorded.
    assert even_series([0, 1, 2, 3], [5.0, None, 7.0, 8.0], 600, MAX) == [5.0, 5.0, 7.0, 8.0]
    # Steps 10..19 never recorded: their columns repeat the last value before them, the columns
    # after them stay at their steps.
    xs = list(range(10)) + list(range(20, 30))
    series = even_series(xs, [float(x) for x in xs], 30, MEAN)
    assert series == [float(x) for x in range(10)] + [9.0] * 10 + [float(x) for x in range(20, 30)]
