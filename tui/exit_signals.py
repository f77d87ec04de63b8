"""How the monitor ends when its terminal or a signal says so, the way ``q`` ends it: Textual gives the
terminal back (alternate screen off, mouse tracking off, cursor shown), then the exit status is
128 + the signal's number, as a shell reports a process killed by it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from textual.app import App

EXIT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
# How often the monitor checks that its terminal still has an owner (see ExitSignals.exit_if_orphaned).
ORPHAN_CHECK_S = 2.0


class ExitSignals:
    """SIGTERM (kill, systemd, tmux kill-pane), SIGHUP (the terminal went away) and SIGINT from another
    process, and a terminal left without its owner, end ``app``."""

    def __init__(self, app: App[Any]) -> None:
        self.app = app
        self.installed = False
        self.parent_pid = os.getppid()

    def install(self) -> None:
        """Call on mount, in the app's event loop: the handlers, and the orphan check."""
        try:
            loop = asyncio.get_running_loop()
            for sig in EXIT_SIGNALS:
                loop.add_signal_handler(sig, self.exit_on_signal, sig)
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            pass
        else:
            self.installed = True
        self.parent_pid = os.getppid()
        self.app.set_interval(ORPHAN_CHECK_S, self.exit_if_orphaned, name="orphan-check")

    def remove(self) -> None:
        if not self.installed:
            return
        for sig in EXIT_SIGNALS:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(sig)

    def exit_on_signal(self, sig: int) -> None:
        self.app.exit(return_code=128 + int(sig))

    def exit_if_orphaned(self) -> None:
        # SIGHUP can be lost (a pty torn down while Textual starts up, under load): such monitors were
        # seen lingering with a deleted tty. The terminal's owner going away re-parents us, so a changed
        # parent PID means nobody is looking at this screen any more.
        if os.getppid() != self.parent_pid:
            self.app.exit()


__all__ = ["EXIT_SIGNALS", "ORPHAN_CHECK_S", "ExitSignals"]
