"""The line-API table: diff by key, repaint only changed rows, keep the cursor on its row."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import App, ComposeResult
from textual.geometry import Region

from tui.widgets.line_table import GAP, LineTable
from tui.widgets.stylesheet import WIDGETS_TCSS

COLUMNS = [("name", "Name", "left"), ("value", "Value", "right")]


class _Host(App[None]):
    CSS_PATH = WIDGETS_TCSS

    def compose(self) -> ComposeResult:
        yield LineTable(COLUMNS, cursor=True, id="t")


def _rows(values: dict[str, int]) -> list[tuple[str, list[Text]]]:
    return [(k, [Text(k), Text(str(v))]) for k, v in values.items()]


async def test_only_changed_rows_are_rendered_again_and_the_cursor_follows_its_key() -> None:
    app = _Host()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(LineTable)
        table.set_rows(_rows({"a": 1, "b": 2, "c": 3}))
        await pilot.pause()
        cached = table.drawn_lines
        assert set(cached) == {"a", "b", "c"}  # every visible row was drawn once
        table.set_rows(_rows({"a": 1, "b": 20, "c": 3}))
        await pilot.pause()
        drawn = table.drawn_lines
        assert drawn["a"] is cached["a"] and drawn["c"] is cached["c"]
        assert drawn["b"] is not cached["b"]
        assert table.get_cell("b", "value").plain == "20"

        table.move_cursor(2)  # on "c"
        table.set_rows(_rows({"c": 3, "new": 9, "a": 1}))  # "b" gone, order changed
        assert table.cursor_key == "c" and table.cursor_row == 0
        table.set_rows(_rows({"a": 1}))  # the cursor's row went away: it stays in range
        assert table.cursor_row == 0 and table.cursor_key == "a"
        table.set_rows([])
        assert table.cursor_key is None and table.row_count == 0


async def test_cursor_moves_post_one_message_per_row_change() -> None:
    seen: list[str | None] = []

    class Recorder(_Host):
        def on_line_table_cursor_moved(self, message: LineTable.CursorMoved) -> None:
            seen.append(message.row_key)

    app = Recorder()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(LineTable)
        table.set_rows(_rows({"a": 1, "b": 2}))
        table.focus()
        await pilot.press("down", "down", "up")
        await pilot.pause()
        assert seen == ["a", "b", "a"]  # the second "down" stopped at the last row: no message


async def test_a_style_only_change_repaints_the_row() -> None:
    app = _Host()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(LineTable)
        table.set_rows([("a", [Text("x"), Text("1")])])
        await pilot.pause()
        before = table.drawn_lines["a"]
        table.set_rows([("a", [Text("x", style="strike"), Text("1")])])  # equal plain text, new style
        await pilot.pause()
        assert table.drawn_lines["a"] is not before


async def test_a_cells_own_style_survives_rendering() -> None:
    app = _Host()
    async with app.run_test(size=(40, 12)) as pilot:
        table = app.query_one(LineTable)
        table.set_rows([("a", [Text("◆", style="bold green"), Text("91%", style="red")])])
        await pilot.pause()
        styles = {seg.text: seg.style for seg in table.drawn_lines["a"] if seg.text.strip()}
        assert styles["◆"] is not None and styles["◆"].bold and styles["◆"].color is not None
        assert styles["◆"].color.name == "green"
        assert styles["91%"] is not None and styles["91%"].color is not None
        assert styles["91%"].color.name == "red"


THREE = [("name", "Name", "left"), ("cpu", "CPU", "right"), ("time", "Time", "right")]


class _Three(App[None]):
    CSS_PATH = WIDGETS_TCSS

    def compose(self) -> ComposeResult:
        yield LineTable(THREE, cursor=True, id="t")


def _three(rows: dict[str, tuple[str, str]]) -> list[tuple[str, list[Text]]]:
    return [(k, [Text(k), Text(cpu), Text(t)]) for k, (cpu, t) in rows.items()]


def _record_refreshes(table: LineTable) -> list[Region]:
    seen: list[Region] = []
    original = table.refresh

    def refresh(*regions: Region, **kwargs: Any) -> LineTable:
        seen.extend(regions)
        return original(*regions, **kwargs)

    table.refresh = refresh  # type: ignore[method-assign]
    return seen


async def test_a_changed_cell_repaints_only_its_own_columns_of_its_line() -> None:
    app = _Three()
    async with app.run_test(size=(60, 12)) as pilot:
        table = app.query_one(LineTable)
        rows = {"alpha": ("1.0%", "5m"), "b": ("22.5%", "17m")}
        table.set_rows(_three(rows))
        await pilot.pause()
        seen = _record_refreshes(table)
        table.set_rows(_three({"alpha": ("1.0%", "5m"), "b": ("22.5%", "18m")}))
        # Independent layout: one leading space, columns GAP apart, each as wide as its widest text.
        name_w = max(len("Name"), len("alpha"), len("b"))
        cpu_w = max(len("CPU"), len("1.0%"), len("22.5%"))
        time_w = max(len("Time"), len("5m"), len("18m"))
        x_time = 1 + name_w + GAP + cpu_w + GAP
        assert seen == [Region(x_time, 2, time_w, 1)]  # line 0 is the header, "b" is the second row
        seen.clear()
        same = table.get_row("b")
        table.set_rows([("alpha", list(table.get_row("alpha"))), ("b", same)])
        assert seen == []  # nothing changed: nothing repainted


async def test_changed_cells_repaint_the_right_line_when_the_table_is_scrolled() -> None:
    app = _Three()
    async with app.run_test(size=(60, 8)) as pilot:
        table = app.query_one(LineTable)
        rows = {f"p{i:02d}": ("0.0%", "1m") for i in range(30)}
        table.set_rows(_three(rows))
        await pilot.pause()
        table.focus()
        table.move_cursor(20)  # scrolls the cursor's row into view
        await pilot.pause()
        top = int(table.scroll_offset.y)
        assert top > 0
        seen = _record_refreshes(table)
        rows["p20"] = ("9.5%", "1m")  # as wide as before: no new layout, one cell repainted
        table.set_rows(_three(rows))
        assert [r.y for r in seen] == [20 - top + 1]  # the widget's own line of row 20
        await pilot.pause()
        line = "".join(seg.text for seg in table.render_line(20 - top + 1))
        assert "p20" in line and "9.5%" in line
