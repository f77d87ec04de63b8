"""Signals while the monitor starts, in-process: before Textual the handler gives the terminal back and
unwinds; once Textual runs it never raises (it asks the event loop to exit the app, or leaves the signal
pending for the app to honour as it mounts); and the driver resumes application mode only after a
suspension of its own, never on a hang-up's SIGCONT."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tui import startup_signals
from tui.hangup_driver import HangupSafeDriver, TerminalOutput, hangup_safe

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("hangup_child.py")


class FakeApp:
    def __init__(self) -> None:
        self.exits: list[int] = []

    def exit(self, result: object = None, return_code: int = 0) -> None:
        self.exits.append(return_code)


@pytest.fixture
def installed() -> Iterator[list[str]]:
    given_back: list[str] = []
    previous = startup_signals.install(lambda: given_back.append("terminal"))
    yield given_back
    startup_signals.restore(previous)


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.2)  # the Python handler runs between two bytecodes of this thread


def test_before_textual_the_terminal_is_given_back_and_the_start_unwinds(installed: list[str]) -> None:
    with pytest.raises(startup_signals.Signalled) as stop:
        _deliver(signal.SIGHUP)
    assert stop.value.status == 128 + signal.SIGHUP and installed == ["terminal"]
    assert not isinstance(stop.value, Exception)  # no `except Exception` on the way swallows it


def test_while_textual_mounts_the_app_a_signal_waits_for_its_mount(installed: list[str]) -> None:
    # Exiting as Textual composes tore the screen down under the widgets' on_mount (NoMatches: exit
    # status 1 instead of 129, one start-up in four under load in a real terminal).
    app = FakeApp()
    startup_signals.hand_over(app)

    async def running() -> None:
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.sleep(0.2)

    asyncio.run(running())
    assert app.exits == [] and installed == []
    assert startup_signals.pending() == signal.SIGHUP  # the app's mount takes it from here


def test_once_the_app_has_mounted_the_loop_exits_it_and_nothing_is_raised(installed: list[str]) -> None:
    app = FakeApp()
    startup_signals.hand_over(app)
    assert startup_signals.pending() is None  # the app's mount asked: nothing came yet

    async def running() -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(200):
            if app.exits:
                return
            await asyncio.sleep(0.01)

    asyncio.run(running())
    assert app.exits == [128 + signal.SIGTERM] and installed == []
    assert startup_signals.pending() == signal.SIGTERM


def test_a_signal_before_the_loop_runs_waits_for_the_app(installed: list[str]) -> None:
    app = FakeApp()
    startup_signals.hand_over(app)
    _deliver(signal.SIGINT)  # no loop yet: nothing raised, nothing called
    assert app.exits == [] and installed == []
    assert startup_signals.pending() == signal.SIGINT


def test_restore_puts_the_previous_handlers_back() -> None:
    before = signal.getsignal(signal.SIGHUP)
    startup_signals.restore(startup_signals.install(lambda: None))
    assert signal.getsignal(signal.SIGHUP) == before and startup_signals.pending() is None


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[HangupSafeDriver, list[str]]]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGTSTP, signal.SIGCONT)}
    calls: list[str] = []

    async def make() -> HangupSafeDriver:  # a driver is made inside the app's event loop
        return HangupSafeDriver(FakeApp())  # type: ignore[arg-type]

    drv = asyncio.run(make())
    monkeypatch.setattr(drv, "resume_application_mode", lambda: calls.append("resume"))
    monkeypatch.setattr(drv, "suspend_application_mode", lambda: calls.append("suspend"))
    stops: list[Any] = []
    monkeypatch.setattr("textual.drivers.linux_driver.os.kill", lambda pid, sig: stops.append(sig))
    yield drv, calls
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _handler(sig: signal.Signals, driver: HangupSafeDriver) -> Callable[[int, Any], Any]:
    """The handler ``driver`` installed for ``sig``: what the kernel runs on it."""
    handler = signal.getsignal(sig)
    assert callable(handler) and getattr(handler, "__self__", None) is driver, handler
    return handler


def test_a_hangups_sigcont_resumes_nothing(driver: tuple[HangupSafeDriver, list[str]]) -> None:
    drv, calls = driver
    _handler(signal.SIGCONT, drv)(signal.SIGCONT, None)  # what the kernel's SIGCONT runs
    assert calls == []


def test_ctrl_z_then_fg_still_suspends_and_resumes(driver: tuple[HangupSafeDriver, list[str]]) -> None:
    drv, calls = driver
    _handler(signal.SIGTSTP, drv)(signal.SIGTSTP, None)
    _handler(signal.SIGCONT, drv)(signal.SIGCONT, None)
    _handler(signal.SIGCONT, drv)(signal.SIGCONT, None)  # a second, stray one: nothing more
    assert calls == ["suspend", "resume"]


def test_only_the_stock_linux_driver_is_replaced() -> None:
    from textual.drivers.headless_driver import HeadlessDriver
    from textual.drivers.linux_driver import LinuxDriver

    assert hangup_safe(LinuxDriver) is HangupSafeDriver
    assert hangup_safe(HeadlessDriver) is HeadlessDriver


def test_terminal_output_drops_what_a_hung_up_terminal_refuses() -> None:
    class HungUp:
        def __init__(self) -> None:
            self.writes = 0

        def write(self, text: str) -> int:
            self.writes += 1
            raise OSError(5, "Input/output error")

        def flush(self) -> None:
            raise OSError(5, "Input/output error")

    stream = HungUp()
    out = TerminalOutput(stream)
    assert out.write("frame") == 5 and out.gone  # Textual's writer thread would have died here
    out.flush()
    assert out.write("next") == 4 and stream.writes == 1  # dropped, no write attempted again


def test_a_terminal_that_hangs_up_as_textual_starts_ends_the_monitor(tmp_path: Any) -> None:
    """The pty closes (SIGHUP, SIGCONT, every write EIO) just as the app starts: Textual queues its first
    frames for a writer thread that can no longer write. The monitor must exit, not hang."""
    import pty
    import select
    import sys

    from tui.simnvml import Scenario

    scenario = tmp_path / "scenario.json"
    Scenario.demo_box(2).to_json(scenario)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, ANATOMY_TOP_SIMULATE=str(scenario), ANATOMY_TOP_DIR=str(runtime))
    env.update(TERM="xterm-256color", PYTHONPATH=str(REPO))
    for delay in (0.0, 0.01, 0.02, 0.05):
        read, write = os.pipe()
        os.set_inheritable(write, True)
        pid, master = pty.fork()
        if pid == 0:  # the child: exec at once (no Python of this process runs in it)
            os.execve(sys.executable, [sys.executable, str(CHILD), str(write)], env)
        os.close(write)
        status: int | None = None
        try:
            assert select.select([read], [], [], 60)[0], "the child did not start"
            assert os.read(read, 4) == b"run\n"
            time.sleep(delay)
            os.close(master)  # the terminal hangs up
            status = _wait(pid, timeout=max(5.0, 5.0 * os.getloadavg()[0] / (os.cpu_count() or 1)))
            assert status is not None, f"hung after a hang-up {delay} s into Textual's start: {_stacks(pid)}"
            said = os.read(read, 200).decode()
            assert said.split()[0] == str(128 + signal.SIGHUP) and status == 128 + signal.SIGHUP, said
        finally:
            os.close(read)
            if status is None:  # hung (or the test failed before reaping it): end it
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)


def _wait(pid: int, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)


def _stacks(pid: int) -> str:
    import shutil
    import subprocess

    gdb = shutil.which("gdb")
    if gdb is None:
        return "(no gdb for stacks)"
    args = [
        gdb,
        "-p",
        str(pid),
        "-batch",
        "-iex",
        "add-auto-load-safe-path /",
        "-ex",
        "thread apply all py-bt",
    ]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60).stdout
    return "\n".join(ln for ln in out.splitlines() if ln.startswith(("Thread", "  File", "    ")))
