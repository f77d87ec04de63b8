"""The monitor's process actions end to end (headless app, real data layer): the simulated NVML lists real
child processes, the keys act on them. A child that ignores SIGTERM, another user's (as root), one that
exits while the confirmation is up, a monitor that is not root; the environment view; SM % through the
simulator; the filter keys and flags; the GPU history and metrics screens."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import frozen
import pytest
from rich.text import Text

from tui.app import AnatomyTopApp
from tui.screens.environ import EnvironScreen
from tui.screens.process_metrics import ProcessMetricsScreen
from tui.screens.signal_dialog import SignalDialog
from tui.screens.tree import TreeScreen
from tui.selection import process_of_row
from tui.simnvml import Curve, Faults, Scenario, SimProcess, install, uninstall
from tui.sources.filters import ProcessFilter
from tui.sources.machine import MachineSource
from tui.sources.nvml import NvmlSource
from tui.view.process_rows import ProcessRow
from tui.widgets.gpu_history import GpuHistory
from tui.widgets.process_table import ProcessTable

GiB = 1 << 30
NOBODY = 65534
IS_ROOT = os.geteuid() == 0 and shutil.which("setpriv") is not None


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Children:
    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
        self.procs[name] = proc
        deadline = time.monotonic() + 10
        while comm(proc.pid) != "sleep":  # exec done: its signal dispositions are final
            assert time.monotonic() < deadline, name
            time.sleep(0.01)
        return proc.pid

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def box(utc: None) -> Iterator[tuple[Children, Callable[..., AnatomyTopApp]]]:
    children = Children()
    children.start("stubborn", ["bash", "-c", "trap '' TERM; exec sleep 300"])
    children.start("plain", ["sleep", "300"], env={"PATH": os.environ["PATH"], "ANATOMY_SECRET": "s3"})
    children.start("doomed", ["sleep", "300"])
    if IS_ROOT:
        children.start(
            "theirs", ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "300"]
        )
    scenario = Scenario.build(3, 0, faults=Faults(unsupported={2: ("process_utilization",)}))
    scenario.processes = [
        SimProcess(
            pid=proc.pid,
            gpu_index=k % 3,
            used_memory=Curve.constant((k + 1) * GiB),
            sm_util=Curve.constant(40 + k),
            memory_util=Curve.constant(10 + k),
        )
        for k, proc in enumerate(children.procs.values())
    ]
    install(scenario)

    def make(**kwargs: Any) -> AnatomyTopApp:
        source = MachineSource(nvml=NvmlSource())
        kwargs.setdefault("handle_signals", False)
        kwargs.setdefault("host_lookup", frozen.frozen_host_lookup)
        return AnatomyTopApp(source, frozen.FakeAnatomySource([]), interval=60.0, **kwargs)

    try:
        yield children, make
    finally:
        uninstall()
        children.stop()


async def select(app: AnatomyTopApp, pilot: Any, pid: int) -> None:
    table = app.query_one(ProcessTable)
    key = next(k for k, row in table.rows_by_key.items() if row.pid == pid)
    table.move_cursor(table.get_row_index(key))
    await pilot.pause()


async def until(pilot: Any, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


def cell(app: AnatomyTopApp, pid: int, column: str) -> str:
    table = app.query_one(ProcessTable)
    key = next(k for k, row in table.rows_by_key.items() if row.pid == pid)
    value = table.get_cell(key, column)
    return value.plain if isinstance(value, Text) else str(value)


async def test_sigterm_ignored_then_sigkill(box: tuple[Children, Callable[..., AnatomyTopApp]]) -> None:
    children, make = box
    pid = children.pid("stubborn")
    app = make()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await select(app, pilot, pid)
        await pilot.press("T")
        await pilot.pause()
        assert isinstance(app.screen, SignalDialog) and app.screen.target.pid == pid
        assert app.screen.selected == "terminate"
        await pilot.press("enter")
        await pilot.pause()
        assert app.action_messages[-1] == f"sent SIGTERM to PID {pid} (sleep)"
        await until(pilot, lambda: "still running" in app.action_messages[-1])
        assert app.action_messages[-1].startswith(f"PID {pid} is still running 1 s after SIGTERM")
        assert children.procs["stubborn"].poll() is None
        await pilot.press("K")
        await pilot.pause()
        assert isinstance(app.screen, SignalDialog) and app.screen.selected == "kill"
        await pilot.press("enter")
        assert children.procs["stubborn"].wait(timeout=10) == -signal.SIGKILL
        await until(pilot, lambda: app.action_messages[-1] == f"PID {pid} (sleep) has exited")


async def test_a_process_that_exits_while_the_dialog_is_up(
    box: tuple[Children, Callable[..., AnatomyTopApp]],
) -> None:
    children, make = box
    pid = children.pid("doomed")
    app = make()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await select(app, pilot, pid)
        await pilot.press("I")
        await pilot.pause()
        assert isinstance(app.screen, SignalDialog) and app.screen.selected == "interrupt"
        children.procs["doomed"].kill()
        children.procs["doomed"].wait()  # reaped: the PID is free for the kernel to hand out again
        await pilot.press("enter")
        await pilot.pause()
        assert app.action_messages[-1] == f"not sent: PID {pid} has exited"
        # The table still lists it until the next poll; a key on it now says so without a dialog.
        await pilot.press("K")
        await pilot.pause()
        assert not isinstance(app.screen, SignalDialog)
        assert app.action_messages[-1] == f"not sent: PID {pid} has exited"


async def test_escape_sends_nothing(box: tuple[Children, Callable[..., AnatomyTopApp]]) -> None:
    children, make = box
    pid = children.pid("plain")
    app = make()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await select(app, pilot, pid)
        await pilot.press("K", "escape")
        await pilot.pause(0.3)
        assert app.action_messages[-1] == f"cancelled: nothing sent to PID {pid}"
        assert children.procs["plain"].poll() is None


async def test_the_tree_asks_the_selection_to_signal_its_own_selection(
    box: tuple[Children, Callable[..., AnatomyTopApp]],
) -> None:
    children, make = box
    pid = children.pid("plain")
    app = make()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await select(app, pilot, pid)
        await pilot.press("t")
        await pilot.pause()
        tree = app.screen
        assert isinstance(tree, TreeScreen)
        await until(pilot, lambda: tree.builds >= 1 and tree.selected is not None)
        assert tree.selected is not None and tree.selected.pid == pid
        await pilot.press("K")  # posted by the tree, answered by the app's Selection
        await until(pilot, lambda: isinstance(app.screen, SignalDialog))
        assert isinstance(app.screen, SignalDialog) and app.screen.target.pid == pid
        assert app.screen.selected == "kill"
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is tree)
        assert app.action_messages[-1] == f"cancelled: nothing sent to PID {pid}"
        assert children.procs["plain"].poll() is None


@pytest.mark.skipif(not IS_ROOT, reason="needs root and setpriv")
async def test_root_signals_another_users_process_after_seeing_whose_it_is(
    box: tuple[Children, Callable[..., AnatomyTopApp]],
) -> None:
    children, make = box
    pid = children.pid("theirs")
    app = make()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await select(app, pilot, pid)
        assert cell(app, pid, "user") == "nobody"
        await pilot.press("T")
        await pilot.pause()
        assert isinstance(app.screen, SignalDialog) and app.screen.target.user == "nobody"
        await pilot.press("enter")
        assert children.procs["theirs"].wait(timeout=10) == -signal.SIGTERM
        await until(pilot, lambda: app.action_messages[-1] == f"PID {pid} (sleep) has exited")


async def test_a_monitor_that_is_not_root_may_not_signal_another_users_process(
    box: tuple[Children, Callable[..., AnatomyTopApp]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As if the monitor ran as uid 4321: these children are someone else's. (The kernel's own refusal
    of a real non-root sender is tested in tests/sources/test_signals.py.)"""
    children, make = box
    pid = children.pid("plain")
    app = make()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await select(app, pilot, pid)
        monkeypatch.setattr(os, "geteuid", lambda: 4321)
        monkeypatch.setattr(os, "getuid", lambda: 4321)
        await pilot.press("K")
        await pilot.pause()
        monkeypatch.undo()
        assert not isinstance(app.screen, SignalDialog)
        owner = cell(app, pid, "user")
        assert app.action_messages[-1] == (
            f"not permitted: PID {pid} belongs to {owner}, not to you (4321); "
            "only root may signal another user's process"
        )
        assert children.procs["plain"].poll() is None


async def test_environment_view(box: tuple[Children, Callable[..., AnatomyTopApp]], read_screen: Any) -> None:
    children, make = box
    pid = children.pid("plain")
    app = make()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await select(app, pilot, pid)
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, EnvironScreen)
        assert app.screen.env.variables == (("PATH", os.environ["PATH"]), ("ANATOMY_SECRET", "s3"))
        assert "ANATOMY_SECRET" in read_screen(app)
        await pilot.press("escape")


async def test_sm_and_memory_bandwidth_through_the_simulator(
    box: tuple[Children, Callable[..., AnatomyTopApp]],
) -> None:
    children, make = box
    app = make()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        for k, name in enumerate(children.procs):
            pid = children.pid(name)
            if k % 3 == 2:  # GPU 2 does not sample processes
                assert (cell(app, pid, "sm"), cell(app, pid, "mbw")) == ("N/A", "N/A")
            else:
                assert (cell(app, pid, "sm"), cell(app, pid, "mbw")) == (f"{40 + k}%", f"{10 + k}%")


async def test_filter_keys_and_the_flags(box: tuple[Children, Callable[..., AnatomyTopApp]]) -> None:
    children, make = box
    app = make(process_filter=ProcessFilter(gpus=frozenset({0, 1})))
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        table = app.query_one(ProcessTable)
        assert {r.gpu_index for r in table.rows_by_key.values()} == {0, 1}
        assert "only GPU 0,1" in app.query_one("#proc-bar").text.plain  # type: ignore[attr-defined]
        from tui.widgets.gpu_table import GpuTable

        assert app.query_one(GpuTable).gpu_count == 2
        await select(app, pilot, children.pid("stubborn"))
        await pilot.press("P")
        assert [r.pid for r in table.rows_by_key.values()] == [children.pid("stubborn")]
        assert "only GPU 0,1 · PID" in app.query_one("#proc-bar").text.plain  # type: ignore[attr-defined]
        await pilot.press("P")
        assert len(table.rows_by_key) > 1


async def test_an_unknown_gpu_in_only_is_named(box: tuple[Children, Callable[..., AnatomyTopApp]]) -> None:
    _, make = box
    app = make(process_filter=ProcessFilter(gpus=frozenset({7})))
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        assert "--only 7: no such GPU here (GPUs: 0, 1, 2)" in app.action_messages


async def test_history_tree_and_metrics(
    box: tuple[Children, Callable[..., AnatomyTopApp]], read_screen: Any
) -> None:
    children, make = box
    pid = children.pid("stubborn")
    app = make()
    async with app.run_test(size=(120, 40)) as pilot:
        await app.wait_for_poll()
        for wanted in (2, 3):
            app.refresh_now()
            await until(pilot, lambda wanted=wanted: app.polls >= wanted)  # type: ignore[misc]
        await pilot.press("h")
        await pilot.pause()
        panel = app.query_one(GpuHistory)
        lines = panel.text.plain.splitlines()  # type: ignore[union-attr]
        assert [line.split()[:2] for line in lines] == [["GPU", "0"], ["GPU", "1"], ["GPU", "2"]]
        await select(app, pilot, pid)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ProcessMetricsScreen)
        text = read_screen(app)
        assert f"PID {pid} on GPU 0" in text and "SM utilization    now       40%" in text
        assert "3 samples, one per refresh" in text or "4 samples, one per refresh" in text
        await pilot.press("escape", "t")
        await pilot.pause()
        assert isinstance(app.screen, TreeScreen)
        screen = app.screen
        await until(pilot, lambda: screen.builds >= 1)
        assert screen.selected is not None and screen.selected.pid == pid
        assert screen.selected.gpus == (0,)
        await pilot.press("e")  # the environment of the tree's selection
        await pilot.pause()
        assert isinstance(app.screen, EnvironScreen) and app.screen.env.pid == pid
        await pilot.press("escape", "escape")
        await pilot.pause()
        assert app.screen is app.screen_stack[0]


def test_selected_process_for_a_host_row_is_the_host_figures() -> None:
    figures = {6001: frozen.frozen_host_lookup([6001])[6001]}
    row = ProcessRow(key="6001", pid=6001, gpu_index=None, type="-", user="a", command="c")
    proc = process_of_row(row, None, figures)
    assert proc is figures[6001] and proc.gpu_index == -1


def test_selected_process_without_figures_is_the_row_itself() -> None:
    row = ProcessRow(key="6002", pid=6002, gpu_index=None, type="C", user="a", command="c")
    proc = process_of_row(row, None, {})
    assert (proc.pid, proc.gpu_index, proc.type, proc.user, proc.command) == (6002, -1, "C", "a", "c")
