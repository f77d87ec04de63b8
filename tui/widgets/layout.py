"""The monitor's layout rules in numbers, shared by the app and the start-up frame (pure, no Textual).

Side by side from WIDE_FROM columns: the nvidia-smi pane then has room for every field of the GPU table on
two lines and a readable command line, and the anatomy pane (ANATOMY_MIN cells at least) for its table.
Below, one pane at a time (tab switches) and the GPU table one line per GPU.
"""

from __future__ import annotations

from tui.widgets.gpu_layout import COMPACT, FULL

WIDE_FROM = 160
ANATOMY_SHARE = 0.46  # of the width, side by side
ANATOMY_MIN = 74  # the component table: name, at peak, share, max in step, B/param, guide
GPU_TABLE_SHARE = 0.45  # of the body's height at most; the process list gets the rest


def is_wide(width: int) -> bool:
    return width >= WIDE_FROM


def anatomy_width(width: int) -> int:
    """The anatomy pane's width side by side (border and padding included)."""
    return max(ANATOMY_MIN, int(width * ANATOMY_SHARE))


def gpu_mode_for(width: int) -> str:
    """The GPU table's layout when the user has not chosen one (``f``)."""
    return FULL if is_wide(width) else COMPACT


def gpu_table_height(body: int, lines: int) -> int:
    """Lines the GPU table gets of a body ``body`` lines high, for ``lines`` lines of content."""
    return min(lines, max(3, int(body * GPU_TABLE_SHARE)))
