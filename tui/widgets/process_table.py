"""The process table: sortable, filterable, diffed by row key; processes that publish anatomy marked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text

from tui import format as fmt
from tui.widgets.line_table import LineTable
from tui.widgets.process_rows import (
    SORT_COLUMNS,
    SORT_KEYS,
    ProcessRow,
    filter_rows,
    sort_rows,
)

COLUMNS: tuple[tuple[str, str], ...] = (
    ("glyph", " "),
    ("gpu", "GPU"),
    ("pid", "PID"),
    ("user", "USER"),
    ("type", "TYPE"),
    ("gpu_memory", "GPU MEM"),
    ("cpu", "CPU%"),
    ("host_mem", "HOST MEM"),
    ("time", "TIME"),
    ("command", "COMMAND"),
)
COLUMN_KEYS: tuple[str, ...] = tuple(k for k, _ in COLUMNS)
_JUSTIFY = {
    "gpu": "right",
    "pid": "right",
    "gpu_memory": "right",
    "cpu": "right",
    "host_mem": "right",
    "time": "right",
}
COMMAND_WIDTH = 72
ANATOMY_GLYPH = "◆"

_GLYPHS: dict[str, tuple[str, str]] = {
    "live": (ANATOMY_GLYPH, "bold green"),
    "oom": ("OOM", "bold reverse red"),
    "exited": ("◇", "bright_black"),
    "error": ("!", "bold yellow"),
}


def _right(value: str) -> Text:
    return Text(value, justify="right", style="bright_black" if value == fmt.NA else "")


def glyph_for(state: str | None) -> Text:
    if state is None:
        return Text("")
    glyph, style = _GLYPHS.get(state, (ANATOMY_GLYPH, "green"))
    return Text(glyph, style=style)


def _shown_values(row: ProcessRow) -> tuple[object, ...]:
    """What the row's cells show, as plain values: rows with equal values have equal cells (running
    time and CPU % move every refresh in the row, rarely on screen)."""
    return (
        row.training_state,
        row.gpu_index,
        row.pid,
        row.user,
        row.type,
        fmt.fmt_bytes(row.gpu_memory),
        fmt.fmt_percent(row.cpu_percent, 1),
        fmt.fmt_bytes(row.host_rss),
        fmt.fmt_elapsed(row.running_time_s),
        row.command,
        row.alive,
        row.rank,
    )


def process_cells(row: ProcessRow) -> tuple[Text, ...]:
    return _cells_of(_shown_values(row))


def _cells_of(values: tuple[object, ...]) -> tuple[Text, ...]:
    state, gpu_index, pid, user, type_, gpu_memory, cpu, rss, elapsed, command, alive, rank = values
    shown = str(command or fmt.NA)
    if len(shown) > COMMAND_WIDTH:
        shown = shown[: COMMAND_WIDTH - 1] + "…"
    command_text = Text(shown, style="" if alive else "strike bright_black")
    if rank is not None:
        command_text.append(f"  rank {rank}", style="cyan")
    return (
        glyph_for(state if isinstance(state, str) else None),
        Text("-" if gpu_index is None else str(gpu_index), justify="right"),
        Text(str(pid), justify="right"),
        Text(str(user or fmt.NA)),
        Text(str(type_)),
        _right(str(gpu_memory)),
        _right(str(cpu)),
        _right(str(rss)),
        _right(str(elapsed)),
        command_text,
    )


class ProcessTable(LineTable):
    """Call ``show(rows)`` with every row; the table applies its own filter and sort order."""

    DEFAULT_CSS = """
    ProcessTable { height: 1fr; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            [(key, label, _JUSTIFY.get(key, "left")) for key, label in COLUMNS], cursor=True, **kwargs
        )
        self._all: list[ProcessRow] = []
        self.rows_by_key: dict[str, ProcessRow] = {}
        self.sort_column: str = SORT_KEYS[0]
        self.sort_reverse: bool = False
        self.filter_text: str = ""
        # Per row key: the shown values and their cells, reused while the values are equal (most rows,
        # most refreshes), so set_rows sees the very same cell tuple and skips the row.
        self._cells_cache: dict[str, tuple[tuple[object, ...], tuple[Text, ...]]] = {}

    # -- state changes ------------------------------------------------------------------------

    def show(self, rows: Sequence[ProcessRow]) -> None:
        self._all = list(rows)
        self._render_rows()

    def cycle_sort(self) -> str:
        index = (SORT_KEYS.index(self.sort_column) + 1) % len(SORT_KEYS)
        self.sort_column = SORT_KEYS[index]
        self.sort_reverse = False
        self._render_rows()
        return self.sort_column

    def toggle_reverse(self) -> bool:
        self.sort_reverse = not self.sort_reverse
        self._render_rows()
        return self.sort_reverse

    def set_filter(self, text: str) -> None:
        if text != self.filter_text:
            self.filter_text = text
            self._render_rows()

    # -- views --------------------------------------------------------------------------------

    @property
    def sort_label(self) -> str:
        label = next(c.label for c in SORT_COLUMNS if c.key == self.sort_column)
        return f"{label} {'▲' if self.sort_reverse else '▼'}"

    @property
    def selected_row(self) -> ProcessRow | None:
        key = self.cursor_key
        return self.rows_by_key.get(key) if key is not None else None

    @property
    def visible_keys(self) -> list[str]:
        return list(self.row_keys)

    @property
    def total_count(self) -> int:
        return len(self._all)

    def _cells_for(self, row: ProcessRow) -> tuple[Text, ...]:
        values = _shown_values(row)
        cached = self._cells_cache.get(row.key)
        if cached is not None and cached[0] == values:
            return cached[1]
        cells = _cells_of(values)
        self._cells_cache[row.key] = (values, cells)
        return cells

    def _render_rows(self) -> None:
        shown = sort_rows(filter_rows(self._all, self.filter_text), self.sort_column, self.sort_reverse)
        self.rows_by_key = {r.key: r for r in shown}
        self.set_rows([(r.key, self._cells_for(r)) for r in shown])
        if len(self._cells_cache) > 2 * len(self._all) + 16:
            keys = {r.key for r in self._all}
            self._cells_cache = {k: v for k, v in self._cells_cache.items() if k in keys}
