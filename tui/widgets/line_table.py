"""A table drawn with Textual's line API: one cached strip per row, and a refresh repaints only the rows
whose cells changed.

A DataTable repaints every visible cell (and every empty line below them) whenever any one cell
changes; in a monitor where utilisation, power, temperature and CPU % move every second that was most
of the app's CPU (measured: ~45 ms of main-thread time per refresh on a simulated 8-GPU box, ~20 ms after
the GPU table moved to this widget, less again with the process table). Rows are identified by key:
``set_rows`` diffs by key, keeps the cursor on its row, and never clears.

Cells are ``rich.text.Text`` (never parsed as markup). With ``cursor=True`` the table is focusable,
has a row cursor (arrows, page keys, home/end, mouse click) and posts ``CursorMoved``. A column label
with line breaks makes a header of several lines. One column may be ``flex``: it gets the width the
others leave, and its longer cells are shortened by ``elide`` (a command line keeps its start and end).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

GAP = 2  # spaces between columns
_HEADER_KEY = "\0header"  # the header's key in the cell cache (row keys are never NUL-prefixed)
FLEX_MIN = 12  # a flex column never gets fewer cells than this (the table scrolls sideways instead)
Columns = Sequence[tuple[str, str, str]]


def elide_end(text: Text, width: int) -> Text:
    """``text`` cut to ``width`` cells, an ellipsis in the last cell."""
    if text.cell_len <= width:
        return text
    cut = text.copy()
    cut.truncate(max(0, width - 1))
    cut.append("…")
    return cut


def same_text(a: Text | str | None, b: Text | str | None) -> bool:
    """Equal as shown: rich's ``Text.__eq__`` ignores the base style (a process greyed out when it
    exits would otherwise never repaint)."""
    if isinstance(a, Text) and isinstance(b, Text):
        return a.plain == b.plain and a.style == b.style and a.spans == b.spans
    return a == b


class LineTable(ScrollView):
    """``columns``: (key, label, justify) triples. ``set_rows`` takes (row key, cells) pairs in display
    order."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"line-table--header", "line-table--cursor"}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home", "first", "First", show=False),
        Binding("end", "last", "Last", show=False),
    ]

    class CursorMoved(Message):
        """The cursor is on another row (by key), after a key, a click, or rows moving."""

        def __init__(self, table: LineTable, row_key: str | None) -> None:
            super().__init__()
            self.table = table
            self.row_key = row_key

        @property
        def control(self) -> LineTable:
            return self.table

    def __init__(
        self,
        columns: Columns,
        *,
        cursor: bool = False,
        gap: int = GAP,
        flex: str | None = None,
        elide: Callable[[Text, int], Text] = elide_end,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.can_focus = cursor
        self.show_cursor = cursor
        self.gap = gap
        self._elide = elide
        self.row_keys: list[str] = []
        self._row_index: dict[str, int] = {}
        self._cells: dict[str, tuple[Text, ...]] = {}
        self._strips: dict[str, Strip] = {}
        self._header: list[Strip] | None = None
        self._set_columns(columns, flex)
        self.cursor_row = 0
        self._announced: str | None = None
        self._style_cache: tuple[Style, Style, Style] | None = None
        self._cell_cache: dict[tuple[str, int], tuple[Text, int, list[Segment]]] = {}
        self._lens: dict[str, tuple[tuple[Text, ...], list[int]]] = {}  # per row: its cells' widths

    def _set_columns(self, columns: Columns, flex: str | None) -> None:
        self.columns = tuple(columns)
        self._column_index = {key: i for i, (key, _, _) in enumerate(self.columns)}
        self._flex = self._column_index.get(flex) if flex is not None else None
        self._labels = [Text(label).split("\n", allow_blank=True) for _, label, _ in self.columns]
        self.header_height = max((len(lines) for lines in self._labels), default=1)
        self._label_widths = [max(line.cell_len for line in lines) for lines in self._labels]
        self._widths = list(self._label_widths)
        self._natural = list(self._label_widths)

    def set_columns(self, columns: Columns, flex: str | None = None) -> None:
        """Other columns (another layout of the same data): the rows are cleared; call ``set_rows``."""
        self._set_columns(columns, flex)
        self.row_keys, self._row_index, self._cells, self._lens = [], {}, {}, {}
        self._restyle()
        self.virtual_size = Size(0, self.header_height)
        self.refresh(layout=True)

    # -- data ------------------------------------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self.row_keys)

    def get_row(self, key: str) -> tuple[Text, ...]:
        return self._cells[key]

    @property
    def drawn_lines(self) -> dict[str, Strip]:
        """The rows' lines as last drawn, by row key (a copy): a row whose cells did not change keeps
        its line across refreshes, which is what keeps a refresh cheap."""
        return dict(self._strips)

    def get_cell(self, key: str, column: str) -> Text:
        return self._cells[key][self._column_index[column]]

    def get_row_index(self, key: str) -> int:
        return self._row_index[key]

    @property
    def cursor_key(self) -> str | None:
        if not self.row_keys:
            return None
        return self.row_keys[min(self.cursor_row, len(self.row_keys) - 1)]

    def set_rows(self, rows: Sequence[tuple[str, Sequence[Text]]], keep_cursor_on_key: bool = True) -> None:
        """Show ``rows`` in this order. The cursor follows its row's key when that row is still there.

        Only the cells whose text changed are repainted (a screen region per changed row, spanning its
        changed cells): Textual then renders and writes those cells alone. Passing the very same cell
        tuple as last time for a row that did not change makes that row cost one identity test."""
        selected = self.cursor_key
        keys = [k for k, _ in rows]
        new_cells = {k: tuple(cells) for k, cells in rows}
        widths = list(self._label_widths)
        lens_cache = self._lens
        self._lens = {}
        for key, cells in new_cells.items():
            lens = lens_cache.get(key)
            if lens is None or lens[0] is not cells:
                lens = (cells, [cell.cell_len for cell in cells])
            self._lens[key] = lens
            for i, n in enumerate(lens[1]):
                if n > widths[i]:
                    widths[i] = n
        self._natural = list(widths)
        widths = self._fit(widths)
        structural = keys != self.row_keys or widths != self._widths
        changed: list[tuple[int, int, int]] = []  # (row index, first changed column, last changed column)
        for index, key in enumerate(keys):
            old, cells = self._cells.get(key), new_cells[key]
            if old is cells:
                continue
            if old is None or len(old) != len(cells):
                changed.append((index, 0, len(cells) - 1))
                continue
            moved = [i for i, (a, b) in enumerate(zip(old, cells, strict=True)) if not same_text(a, b)]
            if moved:
                changed.append((index, moved[0], moved[-1]))
        self.row_keys, self._cells, self._widths = keys, new_cells, widths
        self._row_index = {k: i for i, k in enumerate(keys)}
        for key in [k for k in self._strips if k not in new_cells]:
            del self._strips[key]
        if len(self._cell_cache) > 2 * len(self.columns) * (len(new_cells) + 1):
            self._cell_cache = {k: v for k, v in self._cell_cache.items() if k[0] in new_cells}
        for index, _, _ in changed:
            self._strips.pop(keys[index], None)
        if keep_cursor_on_key and selected is not None and selected in self._row_index:
            self.cursor_row = self._row_index[selected]
        self.cursor_row = max(0, min(self.cursor_row, len(keys) - 1))
        if structural:
            self._strips.clear()
            self._header = None
            self.virtual_size = Size(self._line_width(widths), len(keys) + self.header_height)
            self.refresh(layout=True)
        elif changed:
            self._refresh_cells(changed)
        self._announce()

    def _line_width(self, widths: Sequence[int]) -> int:
        return sum(widths) + self.gap * max(0, len(widths) - 1) + 2

    def _fit(self, widths: list[int]) -> list[int]:
        """The flex column takes what the others leave of the visible width (never under FLEX_MIN, never
        more than its widest cell)."""
        if self._flex is None:
            return widths
        room = self.scrollable_content_region.width or self.size.width
        if room <= 0:
            return widths
        others = self._line_width(widths) - widths[self._flex]
        fitted = list(widths)
        fitted[self._flex] = max(min(FLEX_MIN, widths[self._flex]), min(widths[self._flex], room - others))
        return fitted

    def _column_x(self, column: int) -> int:
        """The first cell of ``column`` in the unscrolled line (a space, then columns ``gap`` apart)."""
        return 1 + sum(self._widths[:column]) + self.gap * column

    def _refresh_cells(self, changed: Sequence[tuple[int, int, int]]) -> None:
        scroll_x, scroll_y = (int(v) for v in self.scroll_offset)
        height = self.size.height
        top = self.header_height
        for index, first, last in changed:
            y = index + top - scroll_y  # the widget's line: the header's lines stay put
            if top <= y < height:
                x0 = self._column_x(first) - scroll_x
                x1 = self._column_x(last) + self._widths[last] - scroll_x
                if x1 > 0:
                    self.refresh(Region(max(0, x0), y, x1 - max(0, x0), 1))

    def _refresh_row(self, index: int) -> None:
        y = index + self.header_height - int(self.scroll_offset.y)
        if self.header_height <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    # -- cursor ------------------------------------------------------------------------------------

    def move_cursor(self, row: int, scroll: bool = True) -> None:
        if not self.row_keys:
            return
        row = max(0, min(row, len(self.row_keys) - 1))
        old = self.cursor_row
        self.cursor_row = row
        if scroll:
            self._scroll_to_cursor()
        for index in {old, row}:
            self._refresh_row(index)
        self._announce()

    def _announce(self) -> None:
        key = self.cursor_key
        if key != self._announced:
            self._announced = key
            self.post_message(self.CursorMoved(self, key))

    def _visible_rows(self) -> int:
        return max(1, self.scrollable_content_region.height - self.header_height)

    def _scroll_to_cursor(self) -> None:
        top = int(self.scroll_offset.y)
        visible = self._visible_rows()
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + visible:
            self.scroll_to(y=self.cursor_row - visible + 1, animate=False, immediate=True)

    def action_cursor_up(self) -> None:
        self.move_cursor(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self.move_cursor(self.cursor_row + 1)

    def action_page_up(self) -> None:
        self.move_cursor(self.cursor_row - self._visible_rows())

    def action_page_down(self) -> None:
        self.move_cursor(self.cursor_row + self._visible_rows())

    def action_first(self) -> None:
        self.move_cursor(0)

    def action_last(self) -> None:
        self.move_cursor(len(self.row_keys) - 1)

    def on_click(self, event: events.Click) -> None:
        if not self.show_cursor:
            return
        row = int(self.scroll_offset.y) + event.y - self.header_height
        if 0 <= row < len(self.row_keys) and event.y >= self.header_height:
            self.focus()
            self.move_cursor(row, scroll=False)

    # -- rendering ---------------------------------------------------------------------------------

    def _cell_segments(self, key: str, column: int, cell: Text, width: int) -> list[Segment]:
        """One padded cell as segments, cached per (row, column): a refresh where one column moved (CPU %,
        running time) renders that cell alone, not the row."""
        cached = self._cell_cache.get((key, column))
        if cached is not None and cached[1] == width and same_text(cached[0], cell):
            return cached[2]
        original = cell
        if cell.cell_len > width and column == self._flex:
            cell = self._elide(cell, width)
        pad = " " * max(0, width - cell.cell_len)
        # append_text turns the cell's base style into a span: Text.render alone would drop it.
        text = Text(end="")
        if self.columns[column][2] == "right":
            text.append(pad)
            text.append_text(cell)
        else:
            text.append_text(cell)
            text.append(pad)
        segments = list(text.render(self.app.console, end=""))
        self._cell_cache[(key, column)] = (original, width, segments)
        return segments

    def _render_cells(self, key: str, cells: Sequence[Text], base: Style) -> Strip:
        segments: list[Segment] = [Segment(" ")]
        for i, (cell, width) in enumerate(zip(cells, self._widths, strict=False)):
            if i:
                segments.append(Segment(" " * self.gap))
            segments.extend(self._cell_segments(key, i, cell, width))
        return Strip(Segment.apply_style(segments, base))

    def _styles(self) -> tuple[Style, Style, Style]:
        """(base, header, cursor) styles; computing them per line was a third of a repaint."""
        if self._style_cache is None:
            base = self.rich_style
            self._style_cache = (
                base,
                base + self.get_component_rich_style("line-table--header"),
                self.get_component_rich_style("line-table--cursor"),
            )
        return self._style_cache

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        base, header_style, cursor_style = self._styles()
        if y < self.header_height:
            if self._header is None:
                self._header = [
                    self._render_cells(
                        f"{_HEADER_KEY}{line}",
                        [lines[line] if line < len(lines) else Text() for lines in self._labels],
                        header_style,
                    )
                    for line in range(self.header_height)
                ]
            return self._header[y].crop_extend(scroll_x, scroll_x + width, header_style)
        index = int(scroll_y) + y - self.header_height
        if index >= len(self.row_keys):
            return Strip.blank(width, base)
        key = self.row_keys[index]
        strip = self._strips.get(key)
        if strip is None:
            strip = self._render_cells(key, self._cells[key], base)
            self._strips[key] = strip
        strip = strip.crop_extend(scroll_x, scroll_x + width, base)
        if self.show_cursor and index == self.cursor_row:
            strip = Strip(Segment.apply_style(list(strip), post_style=cursor_style), strip.cell_length)
        return strip

    def _restyle(self) -> None:
        self._style_cache = None
        self._cell_cache.clear()
        self._strips.clear()
        self._header = None

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._restyle()

    def on_focus(self) -> None:
        self._restyle()
        self.refresh()

    def on_blur(self) -> None:
        self._restyle()
        self.refresh()

    def on_resize(self) -> None:
        if self._flex is None:
            return
        widths = self._fit(list(self._natural))
        if widths != self._widths:
            self._widths = widths
            self._strips.clear()
            self._header = None
            self.virtual_size = Size(self._line_width(widths), len(self.row_keys) + self.header_height)
            self.refresh()
