"""The GPU table: every field of nvidia-smi's default view, with memory and utilisation meters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text

from tui import format as fmt
from tui.sources.model import GpuInfo
from tui.widgets.bars import meter
from tui.widgets.line_table import LineTable

METER_WIDTH = 8

COLUMNS: tuple[tuple[str, str], ...] = (
    ("gpu", "GPU"),
    ("name", "Name"),
    ("memory", "Memory-Usage"),
    ("util", "GPU-Util"),
    ("mem_util", "Mem-Util"),
    ("temp", "Temp"),
    ("power", "Pwr:Usage/Cap"),
    ("fan", "Fan"),
    ("perf", "Perf"),
    ("ecc", "Uncorr. ECC"),
    ("persistence", "Persist-M"),
    ("display", "Disp.A"),
    ("bus", "Bus-Id"),
    ("compute", "Compute M."),
    ("mig", "MIG M."),
)
COLUMN_KEYS: tuple[str, ...] = tuple(k for k, _ in COLUMNS)
_JUSTIFY = {"gpu": "right", "mem_util": "right", "temp": "right", "power": "right", "fan": "right"}


def _na(value: str) -> Text:
    return Text(value, style="bright_black") if value == fmt.NA else Text(value)


def gpu_cells(gpu: GpuInfo) -> tuple[Text, ...]:
    if gpu.lost:
        lost = Text("GPU lost", style="bold red")
        if gpu.error:
            lost.append(": ")
            lost.append(Text(gpu.error))
        return (Text(str(gpu.index)), lost, *(Text("") for _ in COLUMNS[2:]))
    fraction = None
    if gpu.memory_used is not None and gpu.memory_total:
        fraction = gpu.memory_used / gpu.memory_total
    memory = meter(fraction, METER_WIDTH)
    memory.append(" ")
    memory.append(fmt.fmt_bytes_pair(gpu.memory_used, gpu.memory_total))
    util = meter(None if gpu.gpu_util is None else gpu.gpu_util / 100.0, METER_WIDTH)
    util.append(f" {fmt.fmt_percent(gpu.gpu_util):>4}")
    perf = fmt.NA if gpu.performance_state is None else f"P{gpu.performance_state}"
    return (
        Text(str(gpu.index)),
        Text(gpu.name or fmt.NA),
        memory,
        util,
        _na(fmt.fmt_percent(gpu.memory_util)),
        _na(fmt.fmt_temp(gpu.temperature_c)),
        Text(fmt.fmt_power(gpu.power_w, gpu.power_limit_w)),
        _na(fmt.fmt_percent(gpu.fan_percent)),
        _na(perf),
        _na(fmt.NA if gpu.ecc_volatile_uncorrected is None else str(gpu.ecc_volatile_uncorrected)),
        _na(fmt.fmt_bool(gpu.persistence_mode)),
        _na(fmt.fmt_bool(gpu.display_active)),
        _na(gpu.bus_id or fmt.NA),
        _na(gpu.compute_mode or fmt.NA),
        _na(fmt.fmt_bool(gpu.mig_mode, yes="Enabled", no="Disabled")),
    )


class GpuTable(LineTable):
    DEFAULT_CSS = """
    GpuTable { height: auto; max-height: 18; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__([(key, label, _JUSTIFY.get(key, "left")) for key, label in COLUMNS], **kwargs)

    def show(self, gpus: Sequence[GpuInfo]) -> None:
        self.set_rows([(f"gpu{g.index}", gpu_cells(g)) for g in sorted(gpus, key=lambda g: g.index)])
