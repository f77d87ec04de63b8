"""Sparklines: a series as one line of eighth-height blocks, newest on the right (pure text, no Textual).

A value maps to one of eight heights over a fixed range (0–100 % for utilization), so two GPUs' lines
compare at a glance; N/A is a blank cell. The ASCII display filter turns the blocks into ``_.-=``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int, low: float = 0.0, high: float = 100.0) -> str:
    """The last ``width`` values as blocks (left-padded with spaces when there are fewer)."""
    if width <= 0:
        return ""
    shown = list(values)[-width:]
    span = high - low if high > low else 1.0
    cells = []
    for value in shown:
        if value is None or not math.isfinite(value):
            cells.append(" ")
            continue
        level = (min(max(value, low), high) - low) / span
        cells.append(BLOCKS[min(len(BLOCKS) - 1, int(level * len(BLOCKS)))])
    return " " * (width - len(shown)) + "".join(cells)


def level_style(value: float | None) -> str:
    """A colour for a utilization: green when low, yellow, red when saturated."""
    if value is None:
        return "bright_black"
    return "green" if value < 50 else "yellow" if value < 85 else "red"


def sparkline_text(
    values: Sequence[float | None],
    width: int,
    low: float = 0.0,
    high: float = 100.0,
    style: str | None = None,
) -> Text:
    latest = next((v for v in reversed(values) if v is not None), None)
    return Text(sparkline(values, width, low, high), style=style or level_style(latest))


__all__ = ["BLOCKS", "level_style", "sparkline", "sparkline_text"]
