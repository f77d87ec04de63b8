"""SIGTERM/SIGHUP/SIGINT while the monitor starts: before Textual runs, and while it starts.

Until the app installs its own handlers (``tui.exit_signals.ExitSignals``), these handlers end the
monitor. Before Textual runs, only our own code is on the main thread's stack (the start-up frame,
imports): the handler gives the terminal back and raises ``Signalled``, which unwinds to ``run_monitor``.
Once ``hand_over(app)`` is called, a Python signal handler must never raise: it runs between two
bytecodes of whatever the main thread is doing — inside Textual's start-up, a ``queue.Queue.put`` to
Textual's writer thread, a ``threading.Condition`` — and an exception there leaves them half done (the
monitor hung for good at exit, its writer thread waiting for a notification that was lost). So from then
on the handler only records the signal; the app honours it as it mounts (``pending``), and once it has
mounted the handler asks the event loop to exit the app, as the app's own handlers do. Exiting before the
mount (as Textual composes) tore the screen down under the widgets' own on_mount: exit status 1.

Stdlib only; ``asyncio`` is imported by the handler only once Textual (which imports it) runs.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Signalled(BaseException):
    """Raised by the start-up handler before Textual runs. A BaseException, so that no ``except
    Exception`` on the way (a failed import, a source that could not start) takes it for an error."""

    def __init__(self, sig: int) -> None:
        super().__init__(sig)
        self.status = 128 + sig


class _State:
    def __init__(self) -> None:
        self.give_back: Callable[[], None] = lambda: None
        self.app: Any = None  # the Textual app once it is about to run
        self.signal: int | None = None
        self.mounted = False  # the app has mounted: it can exit


_state = _State()


def _handler(sig: int, _frame: object) -> None:
    _state.signal = sig
    app = _state.app
    if app is None:
        _state.give_back()
        raise Signalled(sig)
    if not _state.mounted:
        # Textual is composing and mounting the app: exiting now tears the screen down under the
        # widgets' on_mount (a NoMatches, exit status 1 instead of 128 + the signal). The app's own
        # mount takes the signal from ``pending()``.
        return
    asyncio = sys.modules.get("asyncio")
    loop = asyncio.events._get_running_loop() if asyncio is not None else None
    if loop is not None:
        # Appends to the loop's queue and writes its self-pipe, as asyncio's own signal handling does;
        # App.exit then runs on the loop between two of its callbacks.
        loop.call_soon_threadsafe(app.exit, None, 128 + sig)


def install(give_back: Callable[[], None]) -> dict[int, Any]:
    """Install the start-up handlers; ``give_back`` restores the terminal (the start-up frame). Returns
    the previous handlers, for ``restore``."""
    _state.give_back, _state.app, _state.signal, _state.mounted = give_back, None, None, False
    previous: dict[int, Any] = {}
    for sig in SIGNALS:
        with contextlib.suppress(ValueError, OSError):  # not the main thread: leave them alone
            previous[sig] = signal.signal(sig, _handler)
    return previous


def hand_over(app: Any) -> None:
    """Textual is about to run ``app``: from now on a signal exits it instead of raising."""
    _state.app = app


def pending() -> int | None:
    """Called by the app as it mounts: the signal that arrived while Textual started, if any (the app
    exits with it); a signal after this call exits the app from the handler."""
    if _state.app is None:
        return None
    _state.mounted = True
    return _state.signal


def restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        with contextlib.suppress(ValueError, OSError):
            signal.signal(sig, handler)
    _state.give_back, _state.app, _state.signal, _state.mounted = (lambda: None), None, None, False
