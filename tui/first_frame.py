"""The start-up frame: the GPU table and the process list from the first NVML read, on screen before the
interactive monitor (Textual, ~0.2 s to import on a small box) is loaded.

It draws what the monitor's first frame shows, where it shows it — the header, the GPU table in the
layout the width calls for, the process list — from the same text functions the widgets use, then the
monitor takes the screen over (its first frame shows the same snapshot, and fills in the rest: the
anatomy pane, CPU %, as it arrives). Nothing here imports Textual; rich.text only for the shared text
functions, and our own escape sequences (a handful of SGR codes) instead of rich's console.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TextIO

from rich.text import Text

from tui.sources.model import MachineSnapshot
from tui.terminal import Display, to_ascii
from tui.view.gpus import gpu_views
from tui.view.header import header_view
from tui.view.process_cells import GAP, JUSTIFY, columns_for, elide_middle, picker, process_cells
from tui.view.process_rows import TRAINING_FIRST, build_rows, sort_rows
from tui.widgets.gpu_layout import (
    COMPACT_COLUMNS,
    COMPACT_JUSTIFY,
    FULL,
    full_header,
    full_layout,
    full_lines,
)
from tui.widgets.gpu_layout import gpu_cells as compact_cells
from tui.widgets.header_text import COMPACT_BELOW, header_text
from tui.widgets.layout import anatomy_width, gpu_mode_for, gpu_table_height, is_wide

ENTER = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J"  # alternate screen, cursor hidden, cleared
LEAVE = "\x1b[2J\x1b[?25h\x1b[?1049l"  # cleared, cursor shown, back to the normal screen
FLEX_MIN = 12

_NAMED = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")
_ATTRIBUTES = {"bold": "1", "dim": "2", "italic": "3", "underline": "4", "reverse": "7", "strike": "9"}
_GREY = re.compile(r"gr[ae]y(\d+)$")


def _colour(word: str, background: bool) -> str | None:
    base = 40 if background else 30
    if word in _NAMED:
        return str(base + _NAMED.index(word))
    if word.startswith("bright_") and word[7:] in _NAMED:
        return str(base + 60 + _NAMED.index(word[7:]))
    grey = _GREY.match(word)
    if grey:  # rich's greyNN: the 256-colour greyscale ramp (grey0 = 16 .. grey100 = 231)
        level = min(100, int(grey.group(1)))
        index = 232 + round(level / 100 * 23) if 0 < level < 100 else (16 if level == 0 else 231)
        return f"{base + 8};5;{index}"
    return None


@lru_cache(maxsize=256)
def sgr(style: str) -> str:
    """The SGR parameters of a rich style string made of attributes and named colours
    (``"bold reverse red"``, ``"bright_black"``, ``"white on red"``); anything else is left out."""
    codes: list[str] = []
    background = False
    for word in style.split():
        if word == "on":
            background = True
            continue
        if word in _ATTRIBUTES:
            codes.append(_ATTRIBUTES[word])
            continue
        colour = _colour(word, background)
        if colour is not None:
            codes.append(colour)
        background = False
    return ";".join(codes)


def ansi(text: Text, caps: Display, width: int) -> str:
    """One line of ``text``, cut to ``width`` cells, as escape sequences (no colour, no attribute at all
    when colour is off: TERM=dumb and NO_COLOR mean no escapes but the cursor's)."""
    plain = text.plain[:width]
    if caps.ascii:
        plain = to_ascii(plain)
    if caps.plain:
        return plain
    bounds = {0, len(plain)}
    for span in text.spans:
        bounds.update(b for b in (span.start, span.end) if 0 < b < len(plain))
    edges = sorted(bounds)
    out: list[str] = []
    base = str(text.style) if text.style else ""
    for start, end in itertools.pairwise(edges):
        styles = [base] + [str(s.style) for s in text.spans if s.start <= start and s.end >= end]
        codes = sgr(" ".join(s for s in styles if s))
        out.append(f"\x1b[0;{codes}m{plain[start:end]}\x1b[0m" if codes else plain[start:end])
    return "".join(out)


def _table(
    columns: Sequence[tuple[str, str, str]],
    rows: Sequence[Sequence[Text]],
    width: int,
    gap: int,
    flex: int | None = None,
    elide: Callable[[Text, int], Text] | None = None,
) -> list[Text]:
    """What LineTable draws for ``rows``: a header line, then one line per row, columns ``gap`` apart,
    the flex column fitted to what the others leave."""
    widths = [
        max([Text(label).cell_len, *(r[i].cell_len for r in rows)]) for i, (_, label, _) in enumerate(columns)
    ]
    if flex is not None:
        others = sum(widths) - widths[flex] + gap * (len(widths) - 1) + 2
        widths[flex] = max(min(FLEX_MIN, widths[flex]), min(widths[flex], width - others))
    lines = []
    for cells, style in [([Text(label) for _, label, _ in columns], "bold"), *((list(r), "") for r in rows)]:
        line = Text(" ", style=style, end="")
        for i, (cell, (_, _, justify), w) in enumerate(zip(cells, columns, widths, strict=True)):
            if i:
                line.append(" " * gap)
            if cell.cell_len > w and elide is not None and i == flex:
                cell = elide(cell, w)
            pad = " " * max(0, w - cell.cell_len)
            if justify == "right":
                line.append(pad)
                line.append_text(cell)
            else:
                line.append_text(cell)
                line.append(pad)
        lines.append(line)
    return lines


def layout_lines(
    machine: MachineSnapshot, caps: Display, width: int, height: int, interval: float
) -> dict[int, tuple[int, Text]]:
    """Screen line -> (column, text) of the start-up frame: the monitor's header, GPU table, process bar
    and process table at the places the monitor's layout puts them."""
    placed: dict[int, tuple[int, Text]] = {}
    header = header_text(header_view(machine), interval, False, compact=width < COMPACT_BELOW)
    y = 0
    for line in header.split("\n"):
        placed[y] = (1, line)
        y += 1
    if not machine.nvml.available:
        y += 1  # the monitor's NVML banner
    wide = is_wide(width)
    if not wide:
        y += 1  # the pane tabs
    pane = width - anatomy_width(width) if wide else width
    body = height - y - 1  # the key bar
    gpus = gpu_views(machine.gpus)
    if gpu_mode_for(width) == FULL and gpus:
        layout = full_layout(gpus, pane - 2)
        gpu_lines = [Text(" " + line, style="bold") for line in full_header(layout).split("\n")]
        for gpu in gpus:
            gpu_lines += [Text(" ") + line for line in full_lines(gpu, layout)]
    elif gpus:
        columns = [(key, label, COMPACT_JUSTIFY.get(key, "left")) for key, label in COMPACT_COLUMNS]
        gpu_lines = _table(columns, [compact_cells(g) for g in gpus], pane - 2, 2)
    else:
        gpu_lines = []
    for line in gpu_lines[: gpu_table_height(body, len(gpu_lines))]:
        placed[y] = (0, line)
        y += 1
    rows = sort_rows(build_rows(machine, []), TRAINING_FIRST)
    bar = Text("Processes ", style="bold")
    bar.append(str(len(rows)))
    placed[y] = (1, bar)
    y += 1
    shown = columns_for(pane - 2)  # the process table's own rule, so the columns do not jump
    pick = picker(shown)
    columns = [(key, label, JUSTIFY.get(key, "left")) for key, label in shown]
    flex = next(i for i, (key, _, _) in enumerate(columns) if key == "command")
    cells = [tuple(full[i] for i in pick) for full in (process_cells(r) for r in rows)]
    for line in _table(columns, cells, pane - 2, GAP, flex, elide_middle):
        if y >= height - 1:
            break
        placed[y] = (0, line)
        y += 1
    return placed


def render(machine: MachineSnapshot, caps: Display, width: int, height: int, interval: float) -> str:
    """The whole frame as one write: enter the alternate screen, then each line at its place."""
    out = [ENTER]
    for y, (x, line) in sorted(layout_lines(machine, caps, width, height, interval).items()):
        if y < height:
            out.append(f"\x1b[{y + 1};{x + 1}H{ansi(line, caps, max(0, width - x))}")
    return "".join(out)


def _terminal() -> TextIO | None:
    # Where Textual's driver draws (stderr, so that stdout can be redirected): the same stream.
    return sys.__stderr__


def paint(machine: MachineSnapshot, caps: Display, interval: float, stream: TextIO | None = None) -> bool:
    """Draw the start-up frame on ``stream`` (the terminal Textual will draw on) when it is a terminal;
    True when drawn (then the caller owes the terminal ``leave`` unless the monitor took over and left
    it itself)."""
    stream = _terminal() if stream is None else stream
    if stream is None:
        return False
    try:
        if not stream.isatty():
            return False
        size = os.get_terminal_size(stream.fileno())
        stream.write(render(machine, caps, size.columns, size.lines, interval))
        stream.flush()
    except (OSError, ValueError):
        return False
    return True


def leave(stream: TextIO | None = None) -> None:
    """Give the terminal back as it was (when the monitor never started)."""
    stream = _terminal() if stream is None else stream
    if stream is None:
        return
    try:
        stream.write(LEAVE)
        stream.flush()
    except (OSError, ValueError):
        pass
