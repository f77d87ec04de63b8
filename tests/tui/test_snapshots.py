"""Snapshot tests (pytest-textual-snapshot) of the wide and narrow layouts from frozen data.

Regenerate after an intended change with ``pytest tests/tui/test_snapshots.py --snapshot-update`` and
review the SVGs in tests/tui/__snapshots__/ before committing them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import frozen
from screen_reader import screen_text
from textual.pilot import Pilot

from tui.app import AnatomyTopApp
from tui.terminal import Display
from tui.view.process_rows import SORT_KEYS
from tui.widgets.header import MachineHeader

MakeApp = Callable[..., AnatomyTopApp]


async def _header_drawn(pilot: Pilot[Any]) -> None:
    """Until the screen shows every line of the header: a header that grows to two lines (the host's)
    lays the screen out again on a later frame, which a loaded machine may not have drawn yet."""
    app = pilot.app
    header = app.query_one(MachineHeader)
    for _ in range(200):
        await pilot.pause()
        lines = header.text.split("\n")
        shown = screen_text(app)
        if header.size.height == len(lines) and all(line.plain.strip() in shown for line in lines):
            return


async def _first_poll(pilot: Pilot[Any]) -> None:
    app = pilot.app
    assert isinstance(app, AnatomyTopApp)
    await app.wait_for_poll()
    await _header_drawn(pilot)


def test_wide_layout(snap_compare: Any, make_app: MakeApp) -> None:
    assert snap_compare(make_app(), terminal_size=(160, 50), run_before=_first_poll)


def test_medium_layout_one_pane_compact_gpus(snap_compare: Any, make_app: MakeApp) -> None:
    assert snap_compare(make_app(), terminal_size=(120, 40), run_before=_first_poll)


def test_no_colour_ascii_layout(snap_compare: Any, make_app: MakeApp) -> None:
    app = make_app(caps=Display(color=False, unicode=False))
    assert snap_compare(app, terminal_size=(160, 45), run_before=_first_poll)


def test_narrow_layout_processes(snap_compare: Any, make_app: MakeApp) -> None:
    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=_first_poll)


def test_narrow_layout_anatomy_of_oom_process(snap_compare: Any, make_app: MakeApp) -> None:
    async def select_oom(pilot: Pilot[Any]) -> None:
        await _first_poll(pilot)
        await pilot.press(*"s" * SORT_KEYS.index("pid"))  # sort by PID: the OOM process is last
        await pilot.press("end", "tab")
        await _header_drawn(pilot)

    assert snap_compare(make_app(), terminal_size=(60, 20), run_before=select_oom)


def test_no_gpu_layout(snap_compare: Any, make_app: MakeApp) -> None:
    app = make_app(machine=frozen.no_gpu_machine(), training=[frozen.cpu_training()])
    assert snap_compare(app, terminal_size=(130, 36), run_before=_first_poll)
