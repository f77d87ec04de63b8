"""Textual's Linux driver, minus its resume on a SIGCONT nobody asked for.

Textual's driver installs Python handlers for SIGTSTP (suspend: leave application mode, then stop) and
SIGCONT (resume: start application mode again). When a terminal hangs up (a tmux pane or an ssh session
closed), the kernel sends SIGHUP *and* SIGCONT to the terminal's foreground processes. The stock SIGCONT
handler then restarts application mode from inside whatever the main thread was doing at that bytecode —
typically Textual writing a frame through its writer thread's queue — starting a second writer thread
and leaving the first one's queue and locks to a shutdown that waits on them for ever: the monitor
lingered, hung, in ``Queue.put`` (9 times in 9 when a pane was closed as the key bar appeared).

Here SIGCONT resumes only a suspension this driver made itself (Ctrl+Z / SIGTSTP, as before); any other
SIGCONT is what the default action does: nothing.

And Textual's writer thread dies on the first write that fails — every write to a terminal that hung up
fails (EIO) — after which its queue (30 writes) fills and the next write blocks the main thread for ever:
a pane closed while Textual was still drawing its first frames left the monitor hung in ``Queue.put``
with no writer left. Here the writer's stream drops what it cannot write instead, so the queue keeps
draining and the shutdown that the hang-up asked for runs to its end.
"""

from __future__ import annotations

from typing import Any

from textual.driver import Driver
from textual.drivers.linux_driver import LinuxDriver


class TerminalOutput:
    """The terminal stream as Textual's writer thread sees it: once a write or flush fails (the terminal
    hung up: EIO; or the stream was closed), everything after it is dropped, and nothing raises."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return int(self._stream.write(text))
            except (OSError, ValueError):
                self.gone = True
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self.gone = True

    def fileno(self) -> int:
        return int(self._stream.fileno())

    def isatty(self) -> bool:
        return bool(self._stream.isatty())


class HangupSafeDriver(LinuxDriver):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._suspended_by_us = False
        super().__init__(*args, **kwargs)
        self._file = TerminalOutput(self._file)  # type: ignore[assignment]

    def _sigtstp_application(self, *args: Any) -> None:
        self._suspended_by_us = True
        super()._sigtstp_application(*args)

    def _sigcont_application(self, *args: Any) -> None:
        if not self._suspended_by_us:
            return  # a hang-up's SIGCONT (or a stray kill -CONT): there is nothing to resume
        self._suspended_by_us = False
        super()._sigcont_application(*args)


def hangup_safe(driver: type[Driver]) -> type[Driver]:
    """The driver to use instead of ``driver``: this one for Textual's stock Linux driver, else itself
    (the headless test driver, one named by TEXTUAL_DRIVER)."""
    return HangupSafeDriver if driver is LinuxDriver else driver
