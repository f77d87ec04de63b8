"""How a recorded run ended, as the process itself and a later reader can tell. Stdlib only.

The process: an exception that nothing caught ends it through ``sys.excepthook`` (then ``atexit``
closes the tracker, which would otherwise record "finished"). :func:`watch_for_crash` chains a hook in
front of whatever hook is there (it is called, as before, with the same arguments); the end record then
says "crashed" and names the exception. (A tracker used as a context manager and left by an exception
tells its own recorder: ``Recorder.crashed``.)

A reader: a record without an end is "running" only while its process lives, and a PID alone does not
say that: once the process is gone the kernel may give its PID to another. The record's header holds
the process's start time (``/proc/<pid>/stat`` field 22, clock ticks since boot): a live PID with
another start time is another process.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from types import TracebackType

MAX_ERROR_CHARS = 300

_lock = threading.Lock()
_installed = False
_crash: str | None = None


def process_start(pid: int | None = None) -> int | None:
    """When process ``pid`` (default: this one) started, in clock ticks since boot; None where
    ``/proc`` cannot tell (not Linux, no such process, hidden)."""
    try:
        with open(f"/proc/{pid if pid is not None else 'self'}/stat", "rb") as f:
            data = f.read(4096)
        # The command name (field 2) may hold spaces and ")": the fields after it follow its last ")".
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def same_process_alive(pid: int, started: int | None, alive: bool) -> bool:
    """Whether the process a record names still runs: ``alive`` (its PID is in use) and, where the
    record knows the start time (``started``), the PID's process started then."""
    if not alive:
        return False
    if started is None:  # a record from before start times were kept: the PID alone
        return True
    now = process_start(pid)
    return now is None or now == started


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:MAX_ERROR_CHARS]


def is_crash(exc: BaseException | None) -> bool:
    """An exception that ends a run badly: any but ``sys.exit()`` with success."""
    if exc is None:
        return False
    return not (isinstance(exc, SystemExit) and exc.code in (0, None))


def crash() -> str | None:
    """The uncaught exception the process is ending on, as text, or None."""
    return _crash


def watch_for_crash() -> None:
    """Chain a ``sys.excepthook`` that notes an uncaught exception before the hook that was there runs.
    Once per process."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            global _crash
            with contextlib.suppress(Exception):
                if is_crash(value):
                    _crash = describe(value)
            previous(kind, value, tb)

        sys.excepthook = hook
