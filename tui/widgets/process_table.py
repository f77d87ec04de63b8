"""The process table: sortable, filterable, diffed by row key; processes that publish anatomy marked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.text import Text
from textual import events

from tui.view.process_cells import COLUMNS, GAP, JUSTIFY, columns_for, elide_middle, picked, picker
from tui.view.process_rows import SORT_COLUMNS, SORT_KEYS, ProcessRow, filter_rows, sort_rows
from tui.widgets.line_table import LineTable


class ProcessTable(LineTable):
    """Call ``show(rows, cells)`` with every row and its cells; the table applies its own filter and
    sort order."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(
            self._columns(COLUMNS),
            cursor=True,
            gap=GAP,
            flex="command",
            elide=elide_middle,
            **kwargs,
        )
        self._shown_columns = COLUMNS  # all of them, or without the samples when narrow (columns_for)
        self._pick = picker(COLUMNS)
        self._all: list[ProcessRow] = []
        self.rows_by_key: dict[str, ProcessRow] = {}
        self.sort_column: str = SORT_KEYS[0]
        self.sort_reverse: bool = False
        self.filter_text: str = ""
        self.user_moved = False  # the cursor was moved by a key or a click (not only by the app)
        self._row_cells: Mapping[str, tuple[Text, ...]] = {}  # row key -> every column's cell (show's)
        self._narrow_cache: dict[str, tuple[tuple[Text, ...], tuple[int, ...], tuple[Text, ...]]] = {}

    # -- state changes ------------------------------------------------------------------------

    def show(self, rows: Sequence[ProcessRow], cells: Mapping[str, tuple[Text, ...]]) -> None:
        """Show ``rows``; ``cells``: each row key's cells, every column (``PollView.cells``, computed
        off the UI thread)."""
        self._all = list(rows)
        self._row_cells = cells
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

    def _narrow_cells_for(self, key: str, pick: tuple[int, ...]) -> tuple[Text, ...]:
        # Cached like the full cells, so a row whose shown columns did not change (its hidden samples
        # may have) is still the very same tuple.
        full = self._row_cells[key]
        cached = self._narrow_cache.get(key)
        cells = picked(full, pick)
        if cached is not None and cached[1] == pick and (cached[0] is full or cached[2] == cells):
            cells = cached[2]
        self._narrow_cache[key] = (full, pick, cells)
        return cells

    @staticmethod
    def _columns(columns: tuple[tuple[str, str], ...]) -> list[tuple[str, str, str]]:
        return [(key, label, JUSTIFY.get(key, "left")) for key, label in columns]

    def on_resize(self) -> None:
        columns = columns_for(self.size.width)
        if columns != self._shown_columns:
            self._shown_columns, self._pick = columns, picker(columns)
            self.set_columns(self._columns(columns), flex="command")
            self._render_rows()
            return
        super().on_resize()

    def _render_rows(self) -> None:
        shown = sort_rows(filter_rows(self._all, self.filter_text), self.sort_column, self.sort_reverse)
        self.rows_by_key = {r.key: r for r in shown}
        pick = self._pick
        if len(pick) == len(COLUMNS):
            self.set_rows([(r.key, self._row_cells[r.key]) for r in shown])
        else:
            self.set_rows([(r.key, self._narrow_cells_for(r.key, pick)) for r in shown])
        if len(self._narrow_cache) > 2 * len(self._all) + 16:
            keys = {r.key for r in self._all}
            self._narrow_cache = {k: v for k, v in self._narrow_cache.items() if k in keys}

    # -- the user's own moves ------------------------------------------------------------------

    def _moved_by_user(self) -> None:
        self.user_moved = True

    def action_cursor_up(self) -> None:
        self._moved_by_user()
        super().action_cursor_up()

    def action_cursor_down(self) -> None:
        self._moved_by_user()
        super().action_cursor_down()

    def action_page_up(self) -> None:
        self._moved_by_user()
        super().action_page_up()

    def action_page_down(self) -> None:
        self._moved_by_user()
        super().action_page_down()

    def action_first(self) -> None:
        self._moved_by_user()
        super().action_first()

    def action_last(self) -> None:
        self._moved_by_user()
        super().action_last()

    def on_click(self, event: events.Click) -> None:
        self._moved_by_user()
        super().on_click(event)
