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


def process_cells(row: ProcessRow) -> tuple[Text, ...]:
    command = row.command or fmt.NA
    if len(command) > COMMAND_WIDTH:
        command = command[: COMMAND_WIDTH - 1] + "…"
    command_text = Text(command, style="" if row.alive else "strike bright_black")
    if row.rank is not None:
        command_text.append(f"  rank {row.rank}", style="cyan")
    return (
        glyph_for(row.training_state),
        Text("-" if row.gpu_index is None else str(row.gpu_index), justify="right"),
        Text(str(row.pid), justify="right"),
        Text(row.user or fmt.NA),
        Text(row.type),
        _right(fmt.fmt_bytes(row.gpu_memory)),
        _right(fmt.fmt_percent(row.cpu_percent, 1)),
        _right(fmt.fmt_bytes(row.host_rss)),
        _right(fmt.fmt_duration(row.running_time_s)),
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

    def _render_rows(self) -> None:
        shown = sort_rows(filter_rows(self._all, self.filter_text), self.sort_column, self.sort_reverse)
        self.rows_by_key = {r.key: r for r in shown}
        self.set_rows([(r.key, process_cells(r)) for r in shown])
