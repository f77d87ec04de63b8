"""The monitor in terminals without colour or Unicode, its help at 60x20, and what the anatomy pane says
while a training job is starting (headless: Textual's Pilot; the real-terminal versions are in
test_e2e_tmux.py)."""

from __future__ import annotations

import os
from collections.abc import Callable

import frozen
from screen_reader import screen_segments
from textual.widgets import Static

from anatomy.vocabulary import COMPONENT_HELP
from tui.app import AnatomyTopApp
from tui.screens.help import GLOSSARY, HelpScreen, monitor_key_rows
from tui.terminal import Display
from tui.view.bars import COMPONENT_LETTERS
from tui.widgets.anatomy_pane import AnatomyPane
from tui.widgets.line_table import LineTable
from tui.widgets.stacked_bar import StackedBar

MakeApp = Callable[..., AnatomyTopApp]
ReadScreen = Callable[[AnatomyTopApp], str]


def _segments(app: AnatomyTopApp) -> list[tuple[str, object]]:
    return list(screen_segments(app))


async def _select(app: AnatomyTopApp, pilot: object, pid: int) -> None:
    from tui.widgets.process_table import ProcessTable

    table = app.query_one(ProcessTable)
    key = next(k for k, row in table.rows_by_key.items() if row.pid == pid)
    table.move_cursor(row=table.get_row_index(key))
    await pilot.pause()  # type: ignore[attr-defined]


async def test_no_colour_and_ascii_on_every_cell(make_app: MakeApp, read_screen: ReadScreen) -> None:
    app = make_app(caps=Display(color=False, unicode=False))
    async with app.run_test(size=(160, 45)) as pilot:
        await app.wait_for_poll()
        await _select(app, pilot, frozen.TRAIN_PID)
        segments = _segments(app)
        coloured = [(t, s) for t, s in segments if s is not None and (s.color or s.bgcolor)]  # type: ignore[attr-defined]
        assert coloured == []
        assert all(t.isascii() for t, _ in segments), [t for t, _ in segments if not t.isascii()][:5]
        screen = read_screen(app)
        # the memory bar reads through the components' letters, as the table's rows are marked
        bar = app.query_one(StackedBar).render().plain
        assert set(bar) <= set(COMPONENT_LETTERS.values()) and "A" in bar and "W" in bar
        assert "A Activations" in screen and "W Weights" in screen
        # the selected process: reverse video, no colour needed
        assert any(s is not None and s.reverse for t, s in segments if str(frozen.TRAIN_PID) in t)  # type: ignore[attr-defined]
        await pilot.press("question_mark")
        await pilot.pause()
        assert all(t.isascii() for t, _ in _segments(app))


async def test_colour_terminals_keep_their_colours(make_app: MakeApp) -> None:
    app = make_app(caps=Display())
    async with app.run_test(size=(160, 45)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        segments = _segments(app)
        assert any(s is not None and s.color for _, s in segments)  # type: ignore[attr-defined]
        assert any("█" in t for t, _ in segments)


async def test_help_fits_60x20_and_scrolls_to_every_entry(make_app: MakeApp, read_screen: ReadScreen) -> None:
    app = make_app()
    async with app.run_test(size=(60, 20)) as pilot:
        await app.wait_for_poll()
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        body = app.screen.query_one("#help-body")
        assert body.region.width <= 60 and body.region.height <= 20
        assert body.max_scroll_y > 0  # longer than the screen: it scrolls
        seen = read_screen(app)
        while body.scroll_y < body.max_scroll_y:
            await pilot.press("pagedown")
            await pilot.pause()
            seen += read_screen(app)
        flat = " ".join(seen.split())
        for row in monitor_key_rows(app):
            assert row.keys in seen, row.keys
        for word, _ in GLOSSARY:
            assert " ".join(word.split()) in flat, word
        for component in COMPONENT_HELP:
            assert component.label in flat, component.label
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


async def test_the_pane_waits_for_a_starting_job_and_names_no_silent_pid(
    make_app: MakeApp, read_screen: ReadScreen
) -> None:
    """--demo tells the app its training job is starting: until the job publishes, the pane says so,
    and a selected process that does not publish is never reported as such."""
    starting = os.getpid()  # alive, and publishing nothing
    app = make_app(training=[], starting_pid=starting)
    async with app.run_test(size=(160, 45)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        pane = app.query_one(AnatomyPane)
        assert pane.has_class("-empty")
        empty = pane.query_one("#anatomy-empty", Static)
        assert "waiting for the training job to publish (starting)" in str(empty.render())
        assert "does not publish" not in read_screen(app)
        # it published: an ordinary job from now on
        from dataclasses import replace

        published = replace(frozen.training()[0], pid=starting)
        app.anatomy_source.processes = [published]  # type: ignore[attr-defined]
        app.refresh_now()
        await app.wait_for_poll(2)
        await pilot.pause()
        assert app.starting_pid is None and not pane.has_class("-empty")
        assert "does not publish" not in read_screen(app)


async def test_a_job_that_said_hello_but_measured_no_step_yet(make_app: MakeApp) -> None:
    from dataclasses import replace

    job = replace(frozen.training()[0], snapshot=None)
    app = make_app(training=[job])
    async with app.run_test(size=(160, 45)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        pane = app.query_one(AnatomyPane)
        text = str(pane.query_one("#anatomy-empty", Static).render())
        assert pane.has_class("-empty") and f"waiting for PID {job.pid} to publish (starting)" in text
        assert app.query_one("#anatomy-components", LineTable).region.height == 0


async def test_the_cursor_goes_to_a_job_that_starts_publishing_until_the_user_moves_it(
    make_app: MakeApp,
) -> None:
    from tui.widgets.process_table import ProcessTable

    app = make_app(training=[])
    async with app.run_test(size=(160, 45)) as pilot:
        await app.wait_for_poll()
        table = app.query_one(ProcessTable)
        assert table.selected_row is not None and not table.selected_row.publishes
        app.anatomy_source.processes = frozen.training()  # type: ignore[attr-defined]
        app.refresh_now()
        await app.wait_for_poll(2)
        await pilot.pause()
        assert table.selected_row is not None and table.selected_row.publishes
        await pilot.press("end")  # the user's own choice ...
        chosen = table.selected_row
        app.refresh_now()
        await app.wait_for_poll(3)
        await pilot.pause()
        assert table.selected_row == chosen  # ... is kept
