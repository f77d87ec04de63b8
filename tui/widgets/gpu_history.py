"""Per-GPU history: a utilization and a memory sparkline per GPU, one line each, from the data layer's
``MachineHistory`` (the ``h`` key shows and hides it)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual import events

from tui import format as fmt
from tui.sources.history import MachineHistory
from tui.sources.model import GpuInfo
from tui.widgets.sparkline import level_style, sparkline_text
from tui.widgets.text_static import TextStatic

_MIN_SPARK = 4


def history_lines(gpus: Sequence[GpuInfo], history: MachineHistory, width: int) -> Text:
    """``GPU 0 util ▂▄▆█ 88%  mem ▅▅▆▆ 87%`` per GPU, the two sparklines sharing what ``width`` leaves."""
    text = Text(no_wrap=True, overflow="ellipsis")
    label_width = max((len(f"GPU {g.index}") for g in gpus), default=5)
    fixed = label_width + len(" util ") + len(" 100%") + len("  mem ") + len(" 100%")
    spark = max(_MIN_SPARK, (width - fixed) // 2)
    for i, gpu in enumerate(gpus):
        if i:
            text.append("\n")
        text.append(f"GPU {gpu.index}".ljust(label_width), style="bold")
        series = history.gpu(gpu)
        if gpu.lost or series is None:
            text.append("  lost" if gpu.lost else "  no samples yet", style="bright_black")
            continue
        for name, label in (("gpu_util", " util "), ("memory_percent", "  mem ")):
            values = series[name].last(spark)
            latest = series[name].latest()
            text.append(label, style="bright_black")
            text.append_text(sparkline_text(values, spark))
            text.append(f" {fmt.fmt_percent(latest):>4}", style=level_style(latest))
    return text


class GpuHistory(TextStatic):
    def __init__(self, **kwargs: object) -> None:
        super().__init__("", **kwargs)
        self._gpus: Sequence[GpuInfo] = ()
        self._history: MachineHistory | None = None

    def show(self, gpus: Sequence[GpuInfo], history: MachineHistory) -> None:
        self._gpus, self._history = gpus, history
        self._draw()

    def _draw(self) -> None:
        if self._history is None:
            return
        width = self.content_size.width or max(20, self.app.size.width - 2)
        self.show_text(history_lines(self._gpus, self._history, width))

    def on_resize(self, event: events.Resize) -> None:
        self._draw()


__all__ = ["GpuHistory", "history_lines"]
