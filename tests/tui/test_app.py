"""Headless Pilot tests of the monitor: navigation, selection, sorting, filtering, the anatomy pane, OOM,
no GPU, a large box, untrusted text, errors. Expected values come from the frozen data and tui.format,
never from the app's own output."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import frozen
import pytest
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.widgets import Input, Sparkline, Static

from anatomy.vocabulary import Component
from tui import format as fmt
from tui.app import AnatomyTopApp
from tui.screens.environ import EnvironScreen
from tui.screens.process_metrics import ProcessMetricsScreen
from tui.screens.signal_dialog import SignalDialog
from tui.screens.tree import TreeScreen
from tui.sources.anatomy_source import measured_total
from tui.view.gpus import short_name
from tui.view.process_rows import SORT_KEYS, TRAINING_FIRST
from tui.widgets.anatomy_pane import AnatomyPane
from tui.widgets.gpu_history import GpuHistory
from tui.widgets.gpu_layout import COMPACT, FULL
from tui.widgets.gpu_table import GpuTable
from tui.widgets.header import MachineHeader, NvmlBanner
from tui.widgets.key_bar import KeyBar, key_label
from tui.widgets.layout import WIDE_FROM
from tui.widgets.line_table import LineTable
from tui.widgets.process_table import ProcessTable

MakeApp = Callable[..., AnatomyTopApp]
ReadScreen = Callable[[AnatomyTopApp], str]


def _plain(cell: object) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def _static_text(widget: Static) -> str:
    return _plain(widget.render())


async def _select_pid(app: AnatomyTopApp, pilot: object, pid: int) -> None:
    table = app.query_one(ProcessTable)
    key = next(k for k, row in table.rows_by_key.items() if row.pid == pid)
    table.move_cursor(row=table.get_row_index(key))
    await pilot.pause()  # type: ignore[attr-defined]


def _component_bytes(app: AnatomyTopApp) -> dict[str, str]:
    table = app.query_one("#anatomy-components", LineTable)
    return {key: _plain(table.get_cell(key, "bytes")) for key in table.row_keys}


async def test_first_poll_fills_gpu_and_process_tables(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        machine = frozen.machine()
        gpus = app.query_one(GpuTable)
        # side by side: the full layout, two lines per GPU
        assert gpus.mode == FULL and gpus.gpu_count == len(machine.gpus)
        assert gpus.row_count == 2 * len(machine.gpus)
        # every NVML process plus the OOM process NVML no longer lists
        assert app.query_one(ProcessTable).row_count == len(machine.processes) + 1
        first, second = _plain(gpus.get_row("gpu0")[0]), _plain(gpus.get_row("gpu0+")[0])
        assert short_name(machine.gpus[0].name) in first and machine.gpus[0].bus_id in first
        expected_mem = fmt.fmt_bytes_pair(machine.gpus[0].memory_used, machine.gpus[0].memory_total)
        assert expected_mem in second
        assert app.errors == []


async def test_selection_changes_the_anatomy_pane(make_app: MakeApp, read_screen: ReadScreen) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await _select_pid(app, pilot, frozen.TRAIN_PID)
        pane = app.query_one(AnatomyPane)
        assert pane.process is not None and pane.process.pid == frozen.TRAIN_PID
        shown = _component_bytes(app)
        for component, value in frozen.MODEL_BYTES.items():
            assert shown[component.value] == fmt.fmt_bytes(value)
        # CUDA rows reconcile against NVML: context = NVML - reserved, cache = reserved - model sum
        assert shown[Component.CUDA_CONTEXT.value] == fmt.fmt_bytes(frozen.NVML_TRAIN_BYTES - frozen.RESERVED)
        assert shown[Component.ALLOCATOR_CACHE.value] == fmt.fmt_bytes(frozen.RESERVED - frozen.MODEL_SUM)
        assert "✓" in _static_text(app.query_one("#anatomy-reconcile", Static))
        # bytes/param next to the guide's figure
        table = app.query_one("#anatomy-components", LineTable)
        weights_bpp = _plain(table.get_cell(Component.WEIGHTS.value, "bpp"))
        assert weights_bpp == f"{frozen.MODEL_BYTES[Component.WEIGHTS] / frozen.PARAMS:.2f}"
        assert _plain(table.get_cell(Component.WEIGHTS.value, "expected")) == "6.00"
        assert "GPT2LMHeadModel" in read_screen(app)

        await _select_pid(app, pilot, frozen.DDP_PIDS[2])
        assert pane.process is not None and pane.process.pid == frozen.DDP_PIDS[2]
        assert "LlamaForCausalLM" in _static_text(app.query_one("#anatomy-title", Static))


async def test_j_k_and_arrows_move_the_selection(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        table = app.query_one(ProcessTable)
        # processes that publish their anatomy sort first, and the cursor starts on the first
        assert table.rows_by_key[table.row_keys[0]].publishes and table.cursor_row == 0
        await pilot.press("end")
        assert table.cursor_row == table.row_count - 1
        await pilot.press("home")
        assert table.cursor_row == 0
        await pilot.press("j", "j", "down")
        assert table.cursor_row == 3
        await pilot.press("k", "up")
        assert table.cursor_row == 1
        await pilot.click(ProcessTable, offset=(10, 5))  # line 0 is the header: line 5 is row 4
        assert table.cursor_row == 4


async def test_sort_cycles_columns_and_reverses(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        table = app.query_one(ProcessTable)
        procs = frozen.machine().processes
        publishing = {t.pid for t in frozen.training()}
        # the default: processes that publish their anatomy first, each group by GPU memory
        by_gpu_mem = sorted(procs, key=lambda p: (p.pid not in publishing, -(p.gpu_memory or 0)))
        shown_first = [table.rows_by_key[k].pid for k in table.visible_keys]
        assert [p for p in shown_first if p != frozen.OOM_PID] == [p.pid for p in by_gpu_mem]
        assert all(p in publishing for p in shown_first[: len(publishing)])
        assert "◆ first" in _static_text(app.query_one("#proc-bar", Static))
        await pilot.press("s")  # GPU memory alone
        assert table.sort_column == "gpu_memory"
        plain_order = [table.rows_by_key[k].pid for k in table.visible_keys][: len(procs)]
        assert plain_order == [p.pid for p in sorted(procs, key=lambda p: -(p.gpu_memory or 0))]
        await pilot.press("s")  # next column: SM % (the frozen GPUs do not sample: all N/A, GPU then PID)
        assert table.sort_column == "sm_util"
        await pilot.press("s")  # next column: CPU %
        assert table.sort_column == "cpu_percent"
        cpu = {p.pid: p.cpu_percent for p in procs}
        cpu.update({p: 99.0 for p in frozen.frozen_host_lookup([frozen.OOM_PID])})
        shown = [table.rows_by_key[k].pid for k in table.visible_keys]
        assert [cpu[p] for p in shown] == sorted(cpu.values(), reverse=True)
        await pilot.press("S")
        shown_rev = [table.rows_by_key[k].pid for k in table.visible_keys]
        assert [cpu[p] for p in shown_rev] == sorted(cpu.values())
        assert "CPU% ▲" in _static_text(app.query_one("#proc-bar", Static))
        for _ in range(len(SORT_KEYS) - 3):  # a full cycle comes back to the first order
            await pilot.press("s")
        assert table.sort_column == SORT_KEYS[0] == TRAINING_FIRST


async def test_sort_keeps_the_cursor_on_the_selected_process(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await _select_pid(app, pilot, 3003)
        await pilot.press("s", "S", "s")
        table = app.query_one(ProcessTable)
        assert table.selected_row is not None and table.selected_row.pid == 3003


async def test_filter_matches_command_user_and_pid(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        table = app.query_one(ProcessTable)
        await pilot.press("slash")
        assert isinstance(app.focused, Input)
        await pilot.press(*"bob")
        assert [r.pid for r in table.rows_by_key.values()] == [3001]
        await pilot.press("enter")
        assert app.focused is table
        assert "'bob'" in _static_text(app.query_one("#proc-bar", Static))
        await pilot.press("slash", "backspace", "backspace", "backspace", *"510")
        assert sorted(r.pid for r in table.rows_by_key.values()) == list(frozen.DDP_PIDS)
        await pilot.press("backspace", "backspace", "backspace", *"serve.py")
        assert [r.pid for r in table.rows_by_key.values()] == [3001]
        await pilot.press("escape")
        assert table.filter_text == ""
        assert table.row_count == len(frozen.machine().processes) + 1
        assert not app.query_one("#filter", Input).display


async def test_pause_stops_polling_and_resume_polls_again(make_app: MakeApp) -> None:
    app = make_app(interval=0.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await pilot.press("p")
        assert app.paused
        source = app.machine_source
        calls = source.calls  # type: ignore[attr-defined]
        await asyncio.sleep(1.3)
        assert source.calls <= calls + 1  # type: ignore[attr-defined]  # at most the one in flight
        assert "PAUSED" in app.query_one(MachineHeader).text.plain
        polls = app.polls
        await pilot.press("p")
        await app.wait_for_poll(polls + 1)
        assert not app.paused


async def test_plus_minus_change_the_interval_within_bounds(make_app: MakeApp) -> None:
    app = make_app(interval=1.0)
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await pilot.press("plus")
        assert app.interval == 2.0
        await pilot.press("minus", "minus", "minus", "minus")
        assert app.interval == 0.5  # never faster than 2 Hz
        assert "every 0.5 s" in app.query_one(MachineHeader).text.plain


async def test_tab_switches_panes_wide_and_narrow(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        assert app.screen.has_class("-wide")
        await pilot.press("tab")
        assert isinstance(app.focused, AnatomyPane)
        await pilot.press("tab")
        assert isinstance(app.focused, ProcessTable)
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.screen.has_class("-narrow")
        assert app.query_one(ProcessTable).region.height > 0
        assert app.query_one(AnatomyPane).region.height == 0
        await pilot.press("tab")
        await pilot.pause()
        assert app.query_one(AnatomyPane).region.height > 0
        assert app.query_one(ProcessTable).region.height == 0


async def test_help_lists_every_key_and_closes(make_app: MakeApp, read_screen: ReadScreen) -> None:
    from tui.screens.help import HelpScreen, monitor_key_rows

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.pause()
        text = read_screen(app)
        rows = monitor_key_rows(app)
        assert len(rows) > 20
        for row in rows:
            assert row.keys in text and row.what in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark", "question_mark")
        assert not isinstance(app.screen, HelpScreen)


async def test_every_key_in_the_help_screen_works(make_app: MakeApp) -> None:
    """Walks the help's rows (generated from the bindings) and checks each key's effect; a key added
    without a check here fails the test."""
    from tui.screens.help import HelpScreen, monitor_key_rows

    app = make_app(interval=1.0)
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        table = app.query_one(ProcessTable)

        async def arrows() -> None:
            table.move_cursor(0)
            await pilot.press("down", "down", "j")
            assert table.cursor_row == 3
            await pilot.press("up", "k")
            assert table.cursor_row == 1

        async def pages() -> None:
            await pilot.press("end")
            assert table.cursor_row == table.row_count - 1
            await pilot.press("home")
            assert table.cursor_row == 0
            await pilot.press("pagedown")
            assert table.cursor_row == table.row_count - 1  # fewer rows than a page
            await pilot.press("pageup", "down")
            assert table.cursor_row == 1

        async def tab() -> None:
            await pilot.press("tab")
            assert isinstance(app.focused, AnatomyPane)
            await pilot.press("tab")
            assert app.focused is table

        async def sort() -> None:
            before = table.sort_column
            await pilot.press("s")
            assert table.sort_column != before

        async def reverse() -> None:
            before = table.sort_reverse
            await pilot.press("S")
            assert table.sort_reverse is not before

        async def slash() -> None:
            await pilot.press("slash", *"carol")
            assert [r.user for r in table.rows_by_key.values()] == ["carol"]

        async def enter() -> None:
            await pilot.press("enter")
            assert app.focused is table and table.filter_text == "carol"
            await pilot.press("enter")  # on a process now: its metrics
            assert isinstance(app.screen, ProcessMetricsScreen)
            assert app.screen.ref.pid == table.selected_row.pid  # type: ignore[union-attr]
            await pilot.press("escape")
            assert app.screen is app.screen_stack[0]

        async def escape() -> None:
            await pilot.press("escape")
            assert table.filter_text == "" and table.row_count > 1
            await pilot.press("question_mark", "escape")
            assert not isinstance(app.screen, HelpScreen)

        async def pause() -> None:
            await pilot.press("p")
            assert app.paused
            await pilot.press("p")
            assert not app.paused

        async def plus() -> None:
            before = app.interval
            await pilot.press("plus")
            assert app.interval > before

        async def minus() -> None:
            before = app.interval
            await pilot.press("minus")
            assert app.interval < before

        async def dismiss() -> None:
            await _select_pid(app, pilot, frozen.OOM_PID)
            await pilot.press("x")
            assert frozen.OOM_PID in app.anatomy_source.dismissed  # type: ignore[attr-defined]

        async def tree() -> None:
            await pilot.press("t")
            assert isinstance(app.screen, TreeScreen)
            await pilot.press("escape")
            assert app.screen is app.screen_stack[0]

        async def signals_() -> None:
            # The frozen PIDs are not this test's processes: each key either finds the PID gone or
            # someone else's, or asks first; nothing is sent without enter.
            for key in ("T", "K", "I"):
                before = len(app.action_messages)
                await pilot.press(key)
                await pilot.pause()
                if isinstance(app.screen, SignalDialog):
                    await pilot.press("escape")
                    await pilot.pause()
                    assert app.action_messages[-1].startswith("cancelled: nothing sent")
                else:
                    assert app.action_messages[before].startswith(("not sent:", "not permitted:"))

        async def environment() -> None:
            await pilot.press("e")
            assert isinstance(app.screen, EnvironScreen)
            await pilot.press("escape")
            assert app.screen is app.screen_stack[0]

        async def filters() -> None:
            total = table.row_count
            for key, field in (("u", "user"), ("g", "gpu_index"), ("P", "pid")):
                await _select_pid(app, pilot, frozen.TRAIN_PID)
                chosen = getattr(table.selected_row, field)
                await pilot.press(key)
                shown = [getattr(r, field) for r in table.rows_by_key.values()]
                assert shown and set(shown) == {chosen}, key
                await pilot.press(key)
                assert table.row_count == total, key

        async def history() -> None:
            panel = app.query_one(GpuHistory)
            await pilot.press("h")
            assert panel.display and "util" in str(panel.text)
            await pilot.press("h")
            assert not panel.display

        async def plan_like() -> None:
            from tui.screens.plan_like import PlanLikeScreen

            await _select_pid(app, pilot, frozen.TRAIN_PID)
            app.query_one(AnatomyPane).focus()  # the key is the anatomy pane's
            await pilot.press("l")
            assert isinstance(app.screen, PlanLikeScreen) and app.screen.pid == frozen.TRAIN_PID
            await pilot.press("escape")
            assert app.screen is app.screen_stack[0]

        async def help_() -> None:
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")

        async def sideways() -> None:
            # a process table wider than its pane: the arrows scroll it, and back
            await pilot.resize_terminal(60, 20)
            await pilot.pause()
            assert table.virtual_size.width > table.scrollable_content_region.width
            table.focus()
            await pilot.press("right", "right")
            assert table.scroll_offset.x > 0
            await pilot.press("left", "left")
            assert table.scroll_offset.x == 0
            await pilot.resize_terminal(160, 50)
            await pilot.pause()

        async def wheel() -> None:
            await pilot.resize_terminal(60, 20)
            await pilot.pause()
            before = table.scroll_offset
            # the wheel, then Shift+wheel (Textual's own handling: shift turns it sideways)
            table.post_message(events.MouseScrollDown(table, 5, 3, 0, 1, 0, False, False, False))
            await pilot.pause()
            assert table.scroll_offset.y > before.y and table.scroll_offset.x == before.x
            table.post_message(events.MouseScrollDown(table, 5, 3, 0, 1, 0, True, False, False))
            await pilot.pause()
            assert table.scroll_offset.x > before.x
            await pilot.resize_terminal(160, 50)
            await pilot.pause()

        async def click() -> None:
            await pilot.click(ProcessTable, offset=(10, table.header_height + 2))
            assert table.cursor_row == 2 + int(table.scroll_offset.y)
            line = app.query_one(KeyBar).text
            assert isinstance(line, Text)
            await pilot.click(KeyBar, offset=(line.plain.index(" p  Pause") + 1, 0))
            assert app.paused
            await pilot.press("p")

        async def layout() -> None:
            gpus = app.query_one(GpuTable)
            assert gpus.mode == FULL  # side by side
            await pilot.press("f")
            assert gpus.mode == COMPACT and gpus.row_count == gpus.gpu_count
            await pilot.press("f")
            assert gpus.mode == FULL and gpus.row_count == 2 * gpus.gpu_count

        async def quit_() -> None:
            for key in ("q", "ctrl+q", "ctrl+c"):
                other = make_app()
                async with other.run_test(size=(80, 24)) as other_pilot:
                    await other.wait_for_poll()
                    await other_pilot.press(key)
                    await other_pilot.pause()
                    assert not other.is_running, key
            await pilot.press("q")
            await pilot.pause()
            assert not app.is_running

        checks = {
            "move": arrows,
            "page": pages,
            "sideways": sideways,
            "wheel": wheel,
            "click": click,
            "switch-pane": tab,
            "gpu-layout": layout,
            "sort": sort,
            "reverse-sort": reverse,
            "filter": slash,
            "metrics": enter,
            "escape": escape,
            "pause": pause,
            "slower": plus,
            "faster": minus,
            "dismiss": dismiss,
            "tree": tree,
            "signal": signals_,
            "environment": environment,
            "filter-by": filters,
            "gpu-history": history,
            "plan-like": plan_like,
            "help": help_,
            "quit": quit_,
        }
        rows = monitor_key_rows(app)
        assert [row.id for row in rows] == list(checks)
        assert [row.keys for row in rows if row.id in ("signal", "filter-by", "quit")] == [
            "T  K  I",
            "u  g  P",
            "q  ctrl+c  ctrl+q",
        ]
        for row in rows:
            await checks[row.id]()


async def test_quit_key_exits(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running
    assert app.machine_source.closed  # type: ignore[attr-defined]
    assert app.anatomy_source.closed  # type: ignore[attr-defined]


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
async def test_exit_signals_end_the_app_with_128_plus_n(make_app: MakeApp, sig: signal.Signals) -> None:
    app = make_app(handle_signals=True)
    async with app.run_test(size=(120, 40)):
        await app.wait_for_poll()
        os.kill(os.getpid(), sig)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if not app.is_running:
                break
        assert not app.is_running
    assert app.return_code == 128 + int(sig)
    # the handlers are gone with the app: the next signal is the process's default again
    assert signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler)


async def test_exits_when_its_terminal_loses_its_owner(
    make_app: MakeApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lost SIGHUP must not leave a monitor running on a dead tty: being re-parented ends it too.
    monkeypatch.setattr("tui.exit_signals.ORPHAN_CHECK_S", 0.05)
    app = make_app(handle_signals=True)
    async with app.run_test(size=(120, 40)):
        await app.wait_for_poll()
        await asyncio.sleep(0.2)
        assert app.is_running  # same parent: keeps running
        real_parent = os.getppid()
        monkeypatch.setattr("tui.exit_signals.os.getppid", lambda: real_parent + 1)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if not app.is_running:
                break
        assert not app.is_running
    assert app.return_code in (None, 0)


async def test_no_gpu_shows_banner_and_publishers_with_host_figures(
    make_app: MakeApp, read_screen: ReadScreen
) -> None:
    cpu_job = frozen.cpu_training()
    app = make_app(machine=frozen.no_gpu_machine(), training=[cpu_job])
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        banner = app.query_one(NvmlBanner)
        assert banner.display and banner.region.height == 1
        assert frozen.NVML_MISSING.reason in _static_text(banner)
        assert app.query_one(GpuTable).row_count == 0
        table = app.query_one(ProcessTable)
        rows = list(table.rows_by_key.values())
        assert [r.pid for r in rows] == [frozen.CPU_TRAIN_PID]
        figures = frozen.frozen_host_lookup([frozen.CPU_TRAIN_PID])[frozen.CPU_TRAIN_PID]
        assert rows[0].host_rss == figures.host_rss and rows[0].command == figures.command
        screen = read_screen(app)
        assert fmt.fmt_bytes(figures.host_rss) in screen
        # CPU training: no CUDA rows; the model components sum to the measured peak
        shown = _component_bytes(app)
        assert Component.CUDA_CONTEXT.value not in shown
        assert shown[Component.ACTIVATIONS.value] == fmt.fmt_bytes(frozen.MODEL_BYTES[Component.ACTIVATIONS])
        assert "BertForMaskedLM [tiny]" in screen  # a markup-like model class shown verbatim


async def test_big_box_renders_and_diffs_without_losing_the_cursor(make_app: MakeApp) -> None:
    first = frozen.big_machine(16, 300)
    # second sample: 20 processes gone, 15 new ones, every GPU memory figure changed
    kept = [p for p in first.processes if p.pid % 15 != 0]
    new = [frozen.gpu_process(p % 16, 20_000 + p, 3 * frozen.GiB, f"late-{p}") for p in range(15)]
    from dataclasses import replace

    changed = [replace(p, gpu_memory=(p.gpu_memory or 0) + frozen.MiB) for p in kept] + new
    second = replace(first, processes=tuple(changed))
    source = frozen.FakeMachineSource(first, second)
    app = make_app(machine=source, training=[])
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        table = app.query_one(ProcessTable)
        assert app.query_one(GpuTable).gpu_count == 16
        assert table.row_count == 300
        await pilot.press(*"s" * SORT_KEYS.index("pid"))  # sort by PID: a stable order to point at
        assert table.sort_column == "pid"
        table.move_cursor(row=100)
        await pilot.pause()
        top = int(table.scroll_offset.y)
        assert top <= 100 < top + table.scrollable_content_region.height - 1  # scrolled into view
        selected = table.selected_row
        assert selected is not None and selected.pid % 15 != 0
        app.refresh_now()
        await app.wait_for_poll(2)
        await pilot.pause()
        assert table.row_count == len(changed)
        assert table.selected_row is not None and table.selected_row.pid == selected.pid
        want = next(p for p in changed if p.pid == selected.pid).gpu_memory
        assert _plain(table.get_cell(selected.key, "gpu_memory")) == fmt.fmt_bytes(want)


async def test_markup_like_names_are_shown_verbatim(make_app: MakeApp, read_screen: ReadScreen) -> None:
    app = make_app()
    async with app.run_test(size=(200, 50)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        table = app.query_one(ProcessTable)
        commands = {_plain(table.get_cell(key, "command")) for key in table.rows_by_key}
        for command in frozen.MARKUP_COMMANDS:
            assert command in commands
        screen = read_screen(app)
        for command in frozen.MARKUP_COMMANDS:
            assert command in screen


async def test_oom_process_keeps_its_anatomy_marked_with_the_exception(
    make_app: MakeApp, read_screen: ReadScreen
) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        table = app.query_one(ProcessTable)
        oom_key = next(k for k, r in table.rows_by_key.items() if r.pid == frozen.OOM_PID)
        assert _plain(table.get_cell(oom_key, "glyph")) == "×"
        assert _plain(table.get_cell(oom_key, "command")).startswith("OOM ")
        await _select_pid(app, pilot, frozen.OOM_PID)
        alert = app.query_one("#anatomy-alert", Static)
        assert alert.display
        assert frozen.OOM_TEXT in _static_text(alert)  # markup-like text survives verbatim
        assert _component_bytes(app)[Component.WEIGHTS.value] == fmt.fmt_bytes(
            frozen.MODEL_BYTES[Component.WEIGHTS]
        )
        assert "OOM" in _static_text(app.query_one("#anatomy-title", Static))
        await pilot.press("x")  # dismiss the OOM record
        await app.wait_for_poll(2)
        assert frozen.OOM_PID in app.anatomy_source.dismissed  # type: ignore[attr-defined]
        assert all(r.pid != frozen.OOM_PID for r in table.rows_by_key.values())


async def test_ranks_of_a_multi_rank_job_are_grouped(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await _select_pid(app, pilot, frozen.DDP_PIDS[1])
        ranks = app.query_one("#anatomy-ranks", LineTable)
        pane = app.query_one(AnatomyPane)
        assert pane.has_class("-ranks") and ranks.display
        assert ranks.row_keys == [*(str(p) for p in frozen.DDP_PIDS), "total"]
        assert _plain(ranks.get_cell(str(frozen.DDP_PIDS[1]), "rank")) == "▶ 1"
        ddp = [t for t in frozen.training() if t.pid in frozen.DDP_PIDS]
        peaks = [measured_total(t.snapshot) for t in ddp if t.snapshot is not None]
        assert _plain(ranks.get_cell("total", "peak")) == fmt.fmt_bytes(sum(peaks))  # the job's total
        weights = sum(t.snapshot.memory["weights"] or 0 for t in ddp if t.snapshot is not None)
        assert _plain(ranks.get_cell("total", "weights")) == fmt.fmt_bytes(weights)
        # the slowest rank's step time is marked (frozen: rank 3, 0.93 s; 2 % slower: not a straggler)
        assert _plain(ranks.get_cell(str(frozen.DDP_PIDS[3]), "step_s")).endswith("▲")
        assert not _plain(ranks.get_cell(str(frozen.DDP_PIDS[0]), "step_s")).endswith("▲")
        assert "straggler" not in _static_text(app.query_one("#anatomy-ranks-label", Static))
        await _select_pid(app, pilot, frozen.TRAIN_PID)
        assert not pane.has_class("-ranks")


async def test_a_straggler_rank_is_named(make_app: MakeApp) -> None:
    training = frozen.training()
    slow = frozen.DDP_PIDS[2]
    training = [
        replace(t, snapshot=replace(t.snapshot, timing=replace(t.snapshot.timing, step_s=1.5)))
        if t.pid == slow and t.snapshot is not None
        else t
        for t in training
    ]
    app = make_app(training=training)
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await _select_pid(app, pilot, frozen.DDP_PIDS[0])
        ranks = app.query_one("#anatomy-ranks", LineTable)
        assert _plain(ranks.get_cell(str(slow), "step_s")) == "1.50 s ▲"
        assert "rank 2 is the straggler" in _static_text(app.query_one("#anatomy-ranks-label", Static))


async def test_history_sparklines_and_suggestions(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await _select_pid(app, pilot, frozen.TRAIN_PID)
        process = next(t for t in frozen.training() if t.pid == frozen.TRAIN_PID)
        assert list(app.query_one("#spark-memory", Sparkline).data or []) == [
            float(v) for v in process.memory_history
        ]
        assert list(app.query_one("#spark-step", Sparkline).data or []) == list(process.step_time_history)
        text = _static_text(app.query_one("#anatomy-suggestions", Static))
        for i, s in enumerate(frozen.SUGGESTIONS, start=1):
            assert f"{i}. {s.title}" in text
            assert fmt.fmt_bytes(s.saving_bytes) in text
            assert s.source in text
        timing = _static_text(app.query_one("#anatomy-timing", Static))
        assert fmt.fmt_seconds(0.412) in timing and fmt.fmt_rate(39_740.0, "tokens") in timing
        assert fmt.fmt_share(0.4168) in timing  # MFU


async def test_op_groups_show_shares_of_flops_and_time(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await _select_pid(app, pilot, frozen.TRAIN_PID)
        groups = frozen.snapshot(frozen.TRAIN_PID).op_groups
        assert groups is not None
        total_flops = sum(g.flops for g in groups.values() if g.flops is not None)
        total_time = sum(g.time_s for g in groups.values() if g.time_s is not None)
        table = app.query_one("#anatomy-opgroups", LineTable)
        for name, stat in groups.items():
            flops_cell = _plain(table.get_cell(name, "flops"))
            time_cell = _plain(table.get_cell(name, "time"))
            want_f = fmt.fmt_share(stat.flops / total_flops) if stat.flops is not None else fmt.NA
            assert flops_cell.endswith(want_f)
            assert time_cell.endswith(fmt.fmt_share((stat.time_s or 0) / total_time))


async def test_source_failures_become_an_error_line(make_app: MakeApp, read_screen: ReadScreen) -> None:
    failing = frozen.FakeMachineSource(fail=RuntimeError("NVML exploded [bold]x[/]"))
    app = make_app(machine=failing)
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        assert app.is_running
        status = app.query_one("#status", Static)
        assert status.display
        assert "NVML exploded [bold]x[/]" in _static_text(status)
        # the training side still shows
        assert app.query_one(AnatomyPane).process is not None
        assert "Traceback" not in read_screen(app)


async def test_resize_from_wide_to_60x20_keeps_key_widgets(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        for width, height in ((160, 50), (130, 40), (119, 35), (100, 30), (80, 24), (60, 20)):
            await pilot.resize_terminal(width, height)
            await pilot.pause()
            assert app.errors == []
            assert app.screen.has_class("-wide" if width >= WIDE_FROM else "-narrow")
            assert app.query_one("#header").region.height >= 2
            assert app.query_one(ProcessTable).region.height >= 3
            assert app.query_one(GpuTable).region.height >= 2
        await pilot.press("tab")
        await pilot.pause()
        assert app.query_one("#anatomy-components", LineTable).region.height >= 3
        await pilot.resize_terminal(40, 12)  # below what we promise: still no crash
        await pilot.pause()
        assert app.errors == [] and app.is_running
        await pilot.resize_terminal(160, 50)
        await pilot.pause()
        assert app.query_one(ProcessTable).region.height > 0 and app.query_one(AnatomyPane).region.width > 0


async def test_a_snapshot_read_before_textual_is_shown_before_any_poll(make_app: MakeApp) -> None:
    """The command line reads NVML before loading Textual (the start-up frame): the app's first frame
    shows that snapshot while its own first poll is still under way."""
    gate = threading.Event()

    class Slow(frozen.FakeMachineSource):
        def snapshot(self) -> Any:
            gate.wait(10)
            return super().snapshot()

    machine = frozen.machine()
    app = make_app(machine=Slow(), first_machine=machine)
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause()
            assert app.polls == 0
            assert app.query_one(GpuTable).gpu_count == len(machine.gpus)
            assert app.query_one(ProcessTable).row_count == len(machine.processes)
            gate.set()
            await app.wait_for_poll()
    finally:
        gate.set()


def test_run_app_reports_a_failing_start_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import tui.sources.machine as machine_module
    from tui.app import run_app

    class Broken:
        def __init__(self, **kwargs: Any) -> None:
            raise OSError("no /proc here [bold]x[/]")

    monkeypatch.setattr(machine_module, "MachineSource", Broken)
    assert run_app(argparse.Namespace(interval=1.0)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no /proc here [bold]x[/]" in err and "Traceback" not in err


async def test_a_live_publisher_that_went_quiet_is_flagged(make_app: MakeApp) -> None:
    from dataclasses import replace

    now = 1000.0
    quiet = replace(frozen.training()[0], updated_at=now - 95.0)  # the main job, silent for 95 s
    fresh = replace(frozen.training()[1], updated_at=now - 0.5)
    app = make_app(training=[quiet, fresh], monotonic=lambda: now, interval=1.0)
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await _select_pid(app, pilot, quiet.pid)
        title = _static_text(app.query_one("#anatomy-title", Static))
        assert f"no new snapshot for {fmt.fmt_duration(95.0)}" in title
        await _select_pid(app, pilot, fresh.pid)
        assert "no new snapshot" not in _static_text(app.query_one("#anatomy-title", Static))


async def test_key_bar_lists_the_shown_bindings_and_a_click_runs_one(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        bar = app.query_one(KeyBar)
        line = bar.text.plain if isinstance(bar.text, Text) else str(bar.text)
        shown = [b for b in app.BINDINGS if isinstance(b, Binding) and b.show]
        hidden = [b for b in app.BINDINGS if isinstance(b, Binding) and not b.show]
        for binding in shown:
            assert f" {key_label(binding.key)}  {binding.description} " in line
        for binding in hidden:
            assert binding.description not in line
        assert bar.region.y == app.screen.region.height - 1  # the bottom line
        x = line.index(" p  Pause")
        assert not app.paused
        await pilot.click(KeyBar, offset=(x + 1, 0))
        await pilot.pause()
        assert app.paused and "PAUSED" in app.query_one(MachineHeader).text.plain


async def test_time_column_is_coarse(make_app: MakeApp) -> None:
    app = make_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        table = app.query_one(ProcessTable)
        checked = 0
        for key, row in table.rows_by_key.items():
            assert _plain(table.get_cell(key, "time")) == fmt.fmt_elapsed(row.running_time_s)
            checked += row.running_time_s is not None
        assert checked >= 3


async def test_anatomy_pane_is_drawn_again_only_when_its_process_sent_something_new(
    make_app: MakeApp,
) -> None:
    import dataclasses

    source = frozen.FakeAnatomySource()
    app = make_app(training=source)
    async with app.run_test(size=(160, 50)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        pane = app.query_one(AnatomyPane)
        assert pane.process is not None
        pid = pane.process.pid
        drawn: list[int | None] = []
        show = pane.show

        def counting(view: Any, *args: Any, **kwargs: Any) -> None:
            drawn.append(None if view is None else view.process.pid)
            show(view, *args, **kwargs)

        pane.show = counting  # type: ignore[method-assign]
        # Equal, not identical: the real source builds new objects on every poll.
        source.processes = [dataclasses.replace(p) for p in source.processes]
        app.refresh_now()
        await app.wait_for_poll(2)
        assert drawn == []
        # A new snapshot (one more step in the history) is drawn.
        source.processes = [
            dataclasses.replace(p, memory_history=(*p.memory_history, 1)) if p.pid == pid else p
            for p in source.processes
        ]
        app.refresh_now()
        await app.wait_for_poll(3)
        assert drawn == [pid]
