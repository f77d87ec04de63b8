"""The GPU table's layouts (pure text): the full layout puts every nvidia-smi field of every GPU on two
lines within the width it is given; the compact one fits one line, most looked-at fields first."""

from __future__ import annotations

from dataclasses import replace

import frozen
import pytest
from rich.text import Text

from tui import format as fmt
from tui.sources.model import GpuInfo
from tui.view.gpus import GpuView, gpu_view, short_name
from tui.widgets.gpu_layout import (
    COMPACT_COLUMNS,
    COMPACT_CORE,
    FULL_LINES,
    compact_layout,
    full_header,
    full_layout,
    full_lines,
    gpu_cells,
)


def views(gpus: list[GpuInfo]) -> list[GpuView]:
    return [gpu_view(g) for g in gpus]


GPUS = [frozen.gpu(i, used=(i + 1) * 9 * frozen.GiB, util=min(100, 13 * i)) for i in range(8)]


def _values(gpu: GpuInfo) -> list[str]:
    """Every nvidia-smi default field of ``gpu`` as the table writes it (tui.format, independently)."""
    return [
        gpu.bus_id or "",
        fmt.fmt_bool(gpu.persistence_mode),
        fmt.fmt_bool(gpu.display_active),
        str(gpu.ecc_volatile_uncorrected),
        "Enabled" if gpu.mig_mode else "Disabled",
        fmt.fmt_percent(gpu.fan_percent),
        fmt.fmt_temp(gpu.temperature_c),
        f"P{gpu.performance_state}",
        fmt.fmt_power(gpu.power_w, gpu.power_limit_w),
        fmt.fmt_bytes_pair(gpu.memory_used, gpu.memory_total),
        fmt.fmt_percent(gpu.gpu_util),
        gpu.compute_mode or "",
    ]


@pytest.mark.parametrize("width", [72, 80, 84, 86, 100, 120, 160])
def test_full_layout_shows_every_field_within_the_width(width: int) -> None:
    layout = full_layout(views(GPUS), width)
    header = full_header(layout).split("\n")
    assert len(header) == 2
    for line in FULL_LINES:
        for field in line:
            assert field.label in "\n".join(header), field.label
    for gpu in GPUS:
        first, second = full_lines(gpu_view(gpu), layout)
        for text in (*header, first.plain, second.plain):
            assert Text(text).cell_len + 1 <= width, (width, text)  # + the table's leading space
        both = first.plain + " " + second.plain
        for value in _values(gpu):
            assert value in both, (width, value, both)
        assert first.plain.split()[0] == str(gpu.index)
        name = short_name(gpu.name)
        # the name gives way last, and then keeps its start
        assert name in first.plain if layout.name_width >= len(name) else name[:6] in first.plain


def test_full_layout_prefers_room_between_columns_then_meters_then_full_names() -> None:
    wide = full_layout(views(GPUS), 160)
    assert wide.gaps == (2, 2) and wide.meter_width == 10 and not wide.short_names
    pane = full_layout(views(GPUS), 84)  # the nvidia-smi pane side by side at 160 columns
    assert pane.gaps == (2, 2) and pane.meter_width >= 6
    narrow = full_layout(views(GPUS), 72)
    assert narrow.short_names and narrow.line_width <= 71


def test_full_columns_stay_put_while_the_numbers_move() -> None:
    layout = full_layout(views(GPUS), 90)
    busy = [replace(g, memory_used=g.memory_total, power_w=g.power_limit_w, gpu_util=100) for g in GPUS]
    assert full_layout(views(busy), 90) == layout  # sized for the widest values from the start
    for gpu in busy:
        first, second = full_lines(gpu_view(gpu), layout)
        assert first.cell_len == full_lines(gpu_view(GPUS[gpu.index]), layout)[0].cell_len
        assert second.cell_len == full_lines(gpu_view(GPUS[gpu.index]), layout)[1].cell_len


def test_a_lost_gpu_says_so_on_its_first_line() -> None:
    lost = GpuInfo(index=3, lost=True, error="fell off the bus")
    layout = full_layout(views([*GPUS[:3], lost]), 90)
    first, second = full_lines(gpu_view(lost), layout)
    assert "GPU lost: fell off the bus" in first.plain and second.plain == ""


@pytest.mark.parametrize("width", [60, 80, 100, 120, 160, 240])
def test_compact_fits_the_width_core_fields_first(width: int) -> None:
    layout = compact_layout(views(GPUS), width)
    labels = [label for _, label in COMPACT_COLUMNS[: layout.columns]]
    assert labels[:3] == ["GPU", "Name", "Memory-Usage"]
    rows = [gpu_cells(gpu_view(g), layout.meter_width)[: layout.columns] for g in GPUS]
    widths = [max([Text(lb).cell_len, *(r[i].cell_len for r in rows)]) for i, lb in enumerate(labels)]
    assert sum(widths) + 2 * (len(widths) - 1) + 1 <= width
    if width >= 80:
        assert layout.columns >= COMPACT_CORE  # GPU, name, memory, utilisation, temperature, power
    if width >= 240:
        assert layout.columns == len(COMPACT_COLUMNS) and layout.meter_width == 8
