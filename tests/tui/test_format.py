"""Human units: each expectation is computed independently from the input, not copied from output."""

from __future__ import annotations

import math

import pytest

from tui import format as fmt
from tui.view.bars import EMPTY, FULL, meter, split_cells

KiB, MiB, GiB = 1024, 1024**2, 1024**3


@pytest.mark.parametrize("n", [0, 1, 512, 1023])
def test_bytes_below_one_kib_are_whole_bytes(n: int) -> None:
    assert fmt.fmt_bytes(n) == f"{n} B"


@pytest.mark.parametrize(
    ("n", "unit", "divisor", "decimals"),
    [
        (1536, "KiB", KiB, 1),
        (42 * MiB + 600 * KiB, "MiB", MiB, 1),
        (int(1.25 * GiB), "GiB", GiB, 2),
        (80 * GiB, "GiB", GiB, 2),
        (3 * 1024 * GiB, "TiB", 1024 * GiB, 2),
    ],
)
def test_bytes_pick_the_largest_unit_below_1024(n: int, unit: str, divisor: int, decimals: int) -> None:
    assert fmt.fmt_bytes(n) == f"{n / divisor:.{decimals}f} {unit}"


def test_none_and_non_finite_are_na() -> None:
    assert fmt.fmt_bytes(None) == fmt.NA
    assert fmt.fmt_bytes(math.nan) == fmt.NA
    assert fmt.fmt_bytes(None, fmt.UNMEASURED) == "unmeasured"
    for f in (fmt.fmt_percent, fmt.fmt_share, fmt.fmt_duration, fmt.fmt_seconds, fmt.fmt_count):
        assert f(None) == fmt.NA
    assert fmt.fmt_bytes_per_param(None) == fmt.UNMEASURED


def test_bytes_pair_uses_the_unit_of_the_total() -> None:
    assert fmt.fmt_bytes_pair(512 * MiB, 80 * GiB) == f"{512 / 1024:.1f} / 80.0 GiB"
    assert fmt.fmt_bytes_pair(None, 80 * GiB) == f"N/A / {fmt.fmt_bytes(80 * GiB)}"


def test_mib_is_nvidia_smi_style() -> None:
    assert fmt.fmt_mib(40536 * MiB + 5) == "40536MiB"


@pytest.mark.parametrize("seconds", [0, 59, 61, 3599, 3600, 3725, 86400 * 3 + 3725])
def test_duration_splits_days_hours_minutes(seconds: int) -> None:
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    expected = f"{h:02d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
    if d:
        expected = f"{d}d {h:02d}:{m:02d}:{s:02d}"
    assert fmt.fmt_duration(seconds) == expected


def test_seconds_choose_a_readable_unit() -> None:
    assert fmt.fmt_seconds(0.0004) == "400 µs"
    assert fmt.fmt_seconds(0.412) == "412 ms"
    assert fmt.fmt_seconds(1.234) == "1.23 s"
    assert fmt.fmt_seconds(75.04) == "75.0 s"


def test_shares_rates_counts() -> None:
    assert fmt.fmt_share(0.1234) == "12.3%"
    assert fmt.fmt_percent(37.5) == f"{37.5:.0f}%"
    assert fmt.fmt_rate(39_740.0, "tokens") == f"{39_740 / 1000:.1f}k tokens/s"
    assert fmt.fmt_rate(38.8, "samples") == "38.8 samples/s"
    assert fmt.fmt_count(124_439_808) == f"{124_439_808 / 1e6:.1f}M"
    assert fmt.fmt_count(1_300_000_000) == "1.30B"
    assert fmt.fmt_count(512) == "512"
    assert fmt.fmt_power(250.4, 700.0) == "250W / 700W"
    assert fmt.fmt_temp(41) == "41C"
    assert fmt.fmt_tflops(412.34) == "412.3 TFLOP/s"


@pytest.mark.parametrize("width", [1, 7, 40, 73])
def test_split_cells_fills_the_width_and_keeps_small_parts_visible(width: int) -> None:
    values = [1000.0, 1.0, 0.0, 250.0, 3.0]
    cells = split_cells(values, width)
    assert sum(cells) == min(width, sum(cells)) and sum(cells) == width
    assert cells[2] == 0  # nothing for a zero value
    if width >= 4:
        assert all(c >= 1 for c, v in zip(cells, values, strict=True) if v > 0)
    # the biggest value gets the most cells
    assert cells[0] == max(cells)


def test_meter_is_width_cells_with_fraction_filled() -> None:
    text = meter(0.5, 10)
    assert len(text.plain) == 10
    assert text.plain == FULL * 5 + EMPTY * 5
    assert meter(None, 6).plain == EMPTY * 6
    assert meter(1.7, 4).plain == FULL * 4  # clamped


def test_unmeasured_components_say_so_and_take_no_share() -> None:
    import frozen

    from anatomy.vocabulary import Component
    from tui.sources.reconcile import reconcile
    from tui.view.anatomy import component_cells

    memory = dict(frozen.MODEL_BYTES)
    memory[Component.ACTIVATIONS] = None  # type: ignore[assignment]
    snap = frozen.snapshot(frozen.TRAIN_PID, memory=memory)
    cells = component_cells(reconcile(frozen.hello(frozen.TRAIN_PID), snap, frozen.NVML_TRAIN_BYTES))
    activations = [c.plain for c in cells[Component.ACTIVATIONS.value]]
    assert activations[0].endswith(Component.ACTIVATIONS.label)
    assert activations[1] == fmt.UNMEASURED
    assert activations[2] == ""  # no share for what was not measured
    weights = [c.plain for c in cells[Component.WEIGHTS.value]]
    assert weights[1] == fmt.fmt_bytes(frozen.MODEL_BYTES[Component.WEIGHTS])
    assert weights[4] == fmt.fmt_bytes_per_param(6.0)  # the guide's mixed-precision weights figure


@pytest.mark.parametrize("seconds", [0, 1, 59, 60, 61, 119, 3599, 3600, 3725, 86399, 86400, 86400 * 3 + 3725])
def test_elapsed_is_coarse_past_the_first_minute(seconds: int) -> None:
    if seconds < 60:
        expected = f"{seconds}s"
    elif seconds < 3600:
        expected = f"{seconds // 60}m"
    elif seconds < 86400:
        expected = f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    else:
        expected = f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
    assert fmt.fmt_elapsed(seconds) == expected
    assert fmt.fmt_elapsed(seconds + 0.999) == expected or seconds < 60  # truncated, not rounded


def test_elapsed_changes_at_most_once_a_minute_after_the_first() -> None:
    shown = {fmt.fmt_elapsed(float(s)) for s in range(3600, 3660)}
    assert shown == {"1h00m"}
    assert fmt.fmt_elapsed(None) == fmt.NA and fmt.fmt_elapsed(math.inf) == fmt.NA
    assert fmt.fmt_elapsed(-5.0) == "0s"
