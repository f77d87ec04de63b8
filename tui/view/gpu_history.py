"""The per-GPU history panel (``h``) in words: a utilization and a memory sparkline per GPU, one line
each, from the data layer's ``MachineHistory``, fitted to the width the panel has (pure text, no Textual)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from tui import format as fmt
from tui.sources.history import MachineHistory
from tui.sources.model import GpuInfo
from tui.view.sparkline import level_style, sparkline_text

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
