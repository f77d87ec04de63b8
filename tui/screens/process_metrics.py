"""The per-process metrics screen (enter on a process): its GPU memory, SM %, memory-bandwidth %, CPU %
and host memory now, at their peak, and as a chart over the data layer's history, live."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen

from tui import format as fmt
from tui.sanitize import clean
from tui.sources.history import MachineHistory, Series
from tui.sources.model import GpuProcess, MachineSnapshot
from tui.view.sparkline import BLOCKS, level_style
from tui.widgets.text_static import TextStatic


@dataclass(frozen=True)
class ProcessRef:
    """Which process the screen follows: a recycled PID is another process."""

    gpu_index: int
    pid: int
    started_at: float | None

    def matches(self, proc: GpuProcess) -> bool:
        return (proc.gpu_index, proc.pid, proc.started_at) == (self.gpu_index, self.pid, self.started_at)


def chart_lines(
    values: Sequence[float | None], width: int, height: int, low: float, high: float
) -> list[str]:
    """A bar chart ``height`` rows tall of the last ``width`` values, in eighth blocks; N/A is blank."""
    shown = list(values)[-width:] if width > 0 else []
    pad = width - len(shown)
    span = high - low if high > low else 1.0
    eighths: list[int | None] = []
    for value in shown:
        if value is None or not math.isfinite(value):
            eighths.append(None)
        else:
            level = (min(max(value, low), high) - low) / span
            eighths.append(round(level * height * 8))
    rows = []
    for r in range(height):  # top row first
        floor = (height - 1 - r) * 8
        cells = []
        for e in eighths:
            if e is None or e <= floor:
                cells.append(" " if e is None or r < height - 1 or e > 0 else BLOCKS[0])
            elif e >= floor + 8:
                cells.append(BLOCKS[-1])
            else:
                cells.append(BLOCKS[e - floor - 1])
        rows.append(" " * pad + "".join(cells))
    return rows


@dataclass(frozen=True)
class Metric:
    key: str  # the history series
    label: str
    unit: str  # "bytes" or "percent"


METRICS: tuple[Metric, ...] = (
    Metric("gpu_memory", "GPU memory", "bytes"),
    Metric("sm_util", "SM utilization", "percent"),
    Metric("memory_bw_util", "Memory bandwidth", "percent"),
    Metric("cpu_percent", "CPU", "percent"),
    Metric("host_rss", "Host memory", "bytes"),
)


def _value(metric: Metric, value: float | None) -> str:
    if metric.unit == "bytes":
        return fmt.fmt_bytes(value)
    return fmt.fmt_percent(value, 1 if metric.key == "cpu_percent" else 0)


def metrics_text(
    ref: ProcessRef,
    proc: GpuProcess | None,
    series: dict[str, Series] | None,
    snapshot: MachineSnapshot | None,
    width: int,
    chart_height: int,
    interval: float,
) -> Text:
    text = Text()
    text.append(f"PID {ref.pid}", style="bold")
    text.append(f" on GPU {ref.gpu_index}", style="bold")
    if proc is not None:
        text.append(f"  {clean(proc.user or fmt.NA)}", style="cyan")
        text.append(f"  running {fmt.fmt_elapsed(proc.running_time_s)}", style="bright_black")
        text.append("\n")
        text.append(clean(proc.command or proc.name or fmt.NA))
    else:
        text.append("\n")
        text.append(
            "no longer listed: it exited or left this GPU (its history is kept below)", style="yellow"
        )
    text.append("\n")
    samples = len(series["gpu_memory"]) if series else 0
    text.append(
        f"{samples} samples, one per refresh ({interval:g} s) · newest on the right · escape returns",
        style="bright_black",
    )
    gpu = next((g for g in snapshot.gpus if g.index == ref.gpu_index), None) if snapshot is not None else None
    host_total = snapshot.host.memory_total if snapshot is not None else None
    for metric in METRICS:
        values = series[metric.key].last() if series else []
        now = series[metric.key].latest() if series else None
        peak = series[metric.key].peak() if series else None
        if metric.key == "gpu_memory":
            high = float(gpu.memory_total) if gpu is not None and gpu.memory_total else (peak or 1.0)
            scale = f"of {fmt.fmt_bytes(high)}"
        elif metric.key == "host_rss":
            high = float(host_total) if host_total else (peak or 1.0)
            scale = f"of {fmt.fmt_bytes(high)}"
        elif metric.key == "cpu_percent":
            high = max(100.0, peak or 0.0)
            scale = f"0–{high:.0f} %"
        else:
            high = 100.0
            scale = "0–100 %"
        text.append("\n\n")
        text.append(f"{metric.label:<18}", style="bold")
        text.append(
            f"now {_value(metric, now):>9}", style=level_style(now) if metric.unit == "percent" else ""
        )
        text.append(f"   peak {_value(metric, peak):>9}", style="bright_black")
        text.append(f"   {scale}", style="bright_black")
        if values and all(v is None for v in values):
            text.append("\n")
            text.append("N/A: not reported for this process (the GPU does not sample it, or not permitted)",
                        style="bright_black")  # fmt: skip
            continue
        style = "cyan" if metric.unit == "bytes" else level_style(now)
        for line in chart_lines(values, width, chart_height, 0.0, high):
            text.append("\n")
            text.append(line, style=style)
    return text


StateSource = Callable[[], tuple[MachineSnapshot | None, MachineHistory, float]]


class ProcessMetricsScreen(Screen[None]):
    """Follows ``ref`` through ``state()`` (the latest snapshot, the history, the refresh interval)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,enter,q", "close", "Back"),
    ]
    CSS_PATH = "screens.tcss"

    def __init__(self, ref: ProcessRef, state: StateSource) -> None:
        super().__init__()
        self.ref = ref
        self._state = state
        self._drawn: tuple[int, int, int] | None = None  # (samples recorded, width, height) last drawn

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield TextStatic("", id="metrics")

    def on_mount(self) -> None:
        self.redraw()
        self.set_interval(0.25, self.redraw, name="metrics-refresh")

    def on_resize(self, event: events.Resize) -> None:
        self.redraw()

    def redraw(self) -> None:
        snapshot, history, interval = self._state()
        width = max(10, self.size.width - 3)
        # Five charts and their titles in what the screen has under the three header lines.
        chart_height = max(1, min(6, (self.size.height - 3) // len(METRICS) - 2))
        key = (history.recorded, width, chart_height)
        if key == self._drawn:
            return
        self._drawn = key
        procs = snapshot.processes if snapshot is not None else ()
        proc = next((p for p in procs if self.ref.matches(p)), None)
        series = history.process(proc) if proc is not None else self._last_series(history)
        text = metrics_text(self.ref, proc, series, snapshot, width, chart_height, interval)
        self.query_one("#metrics", TextStatic).show_text(text)

    def _last_series(self, history: MachineHistory) -> dict[str, Series] | None:
        ghost = GpuProcess(
            gpu_index=self.ref.gpu_index, pid=self.ref.pid, type="-", started_at=self.ref.started_at
        )
        return history.process(ghost)

    def action_close(self) -> None:
        self.dismiss(None)


__all__ = ["METRICS", "ProcessMetricsScreen", "ProcessRef", "chart_lines", "metrics_text"]
