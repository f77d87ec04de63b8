"""A process's environment from ``/proc/<pid>/environ``: what it was started with.

The kernel shows a process's environment only to its owner and to root (the ptrace "read" check), so
for another user's process the answer is a reason, never a guess. The file holds the environment the
process was *started* with: a later ``setenv``/``os.environ[...] =`` inside it does not show.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tui.sources import procfs
from tui.sources.procfs import PROC


@dataclass(frozen=True)
class Environment:
    """``variables`` in the order the process has them; None where unreadable, with ``reason``."""

    pid: int
    variables: tuple[tuple[str, str], ...] | None
    reason: str | None = None


def parse_environ(data: bytes) -> tuple[tuple[str, str], ...]:
    """NUL-separated ``NAME=value`` entries. Bytes that are not UTF-8 are kept as escapes (the caller
    sanitises for display); an entry without ``=`` (a program may write anything there) is a name with an
    empty value."""
    out = []
    for entry in data.split(b"\0"):
        if not entry:
            continue
        name, _, value = entry.partition(b"=")
        out.append((name.decode("utf-8", "backslashreplace"), value.decode("utf-8", "backslashreplace")))
    return tuple(out)


def read_environ(pid: int, proc: str = PROC) -> Environment:
    """The environment of ``pid``, or why it cannot be shown. Never raises."""
    try:
        data = procfs.read_file(f"{proc}/{pid}/environ")
    except PermissionError:
        return Environment(pid, None, f"PID {pid}'s environment is not readable: {_why_denied(pid, proc)}")
    except OSError as exc:
        return Environment(pid, None, f"PID {pid}'s environment cannot be read: {exc.strerror or exc}")
    if data is None:
        return Environment(pid, None, f"PID {pid} has exited")
    if not data:
        try:
            stat = procfs.read_proc_stat(pid, proc)
        except (OSError, ValueError, IndexError):
            stat = None
        if stat is None or procfs.is_gone(stat):
            return Environment(pid, None, f"PID {pid} has exited")
        return Environment(
            pid, None, f"PID {pid} has no environment (a kernel thread, or it cleared its own)"
        )
    return Environment(pid, parse_environ(data))


def _why_denied(pid: int, proc: str) -> str:
    reader = procfs.ProcReader(proc)
    uid, me = reader.uid_of(pid), os.geteuid()
    if uid is None:
        return "it belongs to another user; only its owner and root can read it"
    if uid == me:  # one's own, yet refused: set-uid, or it made itself undumpable
        return "the process protects it (set-user-ID or not dumpable); root can read it"
    owner, you = reader.user(uid), reader.user(me)
    return f"it belongs to {owner}, not to you ({you}); only its owner and root can read it"


__all__ = ["Environment", "parse_environ", "read_environ"]
