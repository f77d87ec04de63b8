"""Signals to a process the monitor shows: who the PID is now, whether we may signal it, and sending
without ever hitting a recycled PID.

A PID names a process only while it lives: the kernel hands the number out again. So a target is the
PID *and* its start time (``/proc/<pid>/stat`` field 22, in clock ticks since boot). ``identify`` reads
both, the confirmation shows what they name, and ``send`` opens a pidfd (which pins that very
process), checks the start time again through it, and signals through the pidfd: a process that exited
and whose PID was reused between the confirmation and the key press is never signalled. Where pidfds
are missing (kernels before 5.3) the start time is checked just before ``kill``.

The policy is the usual one for a monitor (nvitop, htop): your own processes only, any process as root.
The kernel has the last word: a refusal it gives (EPERM) is reported, never raised.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from dataclasses import dataclass

from tui.sources import procfs
from tui.sources.procfs import PROC, ProcReader

# The signals the monitor sends, by the name its keys and dialogs use. SIGINT is what Ctrl-C sends a
# foreground job (a training loop stops at the next step), SIGTERM asks to exit, SIGKILL cannot be caught.
SIGNALS: dict[str, signal.Signals] = {
    "interrupt": signal.SIGINT,
    "terminate": signal.SIGTERM,
    "kill": signal.SIGKILL,
}
# How far two readings of one process's start time (epoch seconds) may differ: both come from the same
# tick count and boot time, so only float rounding.
_SAME_START_S = 0.05


@dataclass(frozen=True)
class Target:
    """One process as read now: with ``start_ticks`` it cannot be confused with a later owner of its PID."""

    pid: int
    start_ticks: int
    started_at: float | None  # seconds since the epoch
    uid: int | None
    user: str | None
    name: str
    command: str  # the command line, or "[name]" where it is empty (kernel threads) or unreadable


@dataclass(frozen=True)
class Outcome:
    """What a send did, in words for the status line. ``sent``: the signal was delivered."""

    sent: bool
    message: str


class Gone(Exception):
    """The PID names no live process (exited, a zombie, or not in this PID namespace)."""


def signal_name(sig: int) -> str:
    return signal.Signals(sig).name


def identify(pid: int, expected_start: float | None = None, reader: ProcReader | None = None) -> Target:
    """Read ``pid``'s identity from /proc. Raises :class:`Gone` (its message says why) when it has
    exited, and also when ``expected_start`` (the start the table showed) differs: the PID was reused."""
    reader = reader or ProcReader()
    if pid <= 0:
        raise Gone(f"PID {pid} is not a process")
    try:
        stat = reader.stat(pid)
    except (OSError, ValueError, IndexError) as exc:
        raise Gone(f"PID {pid} cannot be read: {exc}") from None
    if stat is None or procfs.is_gone(stat):
        raise Gone(f"PID {pid} has exited")
    try:
        started_at: float | None = reader.created(stat)
    except (OSError, ValueError):
        started_at = None
    if (
        expected_start is not None
        and started_at is not None
        and abs(started_at - expected_start) > _SAME_START_S
    ):
        raise Gone(f"PID {pid} has exited; the number now belongs to another process ({stat.comm})")
    cmdline = reader.cmdline(pid)
    uid = reader.uid_of(pid)
    return Target(
        pid=pid,
        start_ticks=stat.start_ticks,
        started_at=started_at,
        uid=uid,
        user=None if uid is None else reader.user(uid),
        name=procfs.full_name(stat.comm, cmdline),
        command=" ".join(cmdline) if cmdline else f"[{stat.comm}]",
    )


def refusal(target: Target, euid: int | None = None, uid: int | None = None) -> str | None:
    """Why this monitor will not signal ``target`` (None: it may). Root may signal anything; others
    only their own processes, and never the monitor itself."""
    euid = os.geteuid() if euid is None else euid
    uid = os.getuid() if uid is None else uid
    if target.pid == os.getpid():
        return f"PID {target.pid} is this monitor itself (q quits it)"
    if euid == 0:
        return None
    if target.uid is None:
        return f"PID {target.pid}'s owner cannot be read, so it is not yours to signal"
    if target.uid not in (uid, euid):
        mine = ProcReader().user(euid)
        return (
            f"PID {target.pid} belongs to {target.user or target.uid}, not to you ({mine}); "
            "only root may signal another user's process"
        )
    return None


def still_running(target: Target, reader: ProcReader | None = None) -> bool:
    """Whether ``target`` (that very process, not a later one with its PID) is alive and not a zombie."""
    reader = reader or ProcReader()
    try:
        stat = reader.stat(target.pid)
    except (OSError, ValueError, IndexError):
        return False
    return stat is not None and not procfs.is_gone(stat) and stat.start_ticks == target.start_ticks


def send(target: Target, sig: int, reader: ProcReader | None = None) -> Outcome:
    """Send ``sig`` to ``target`` if it is still that process. Never raises."""
    reader = reader or ProcReader()
    name = signal_name(sig)
    what = f"{name} to PID {target.pid} ({target.name})"
    try:
        pidfd = _pidfd_open(target.pid)
    except ProcessLookupError:
        return Outcome(False, f"not sent: PID {target.pid} has exited")
    except OSError as exc:
        return Outcome(False, f"not sent: {what}: {exc.strerror or exc}")
    try:
        # The pidfd names whoever had the PID when it was opened. If /proc shows the confirmed start
        # time after that, that was the confirmed process (it lived all along), and a signal through
        # the pidfd can reach no other, even if it exits and its number is reused meanwhile.
        if not still_running(target, reader):
            return Outcome(False, f"not sent: PID {target.pid} has exited (its number may be reused)")
        if pidfd is None:
            os.kill(target.pid, sig)
        else:
            signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return Outcome(False, f"not sent: PID {target.pid} has exited")
    except PermissionError:
        return Outcome(False, f"not permitted: the kernel refused {what} (EPERM)")
    except OSError as exc:
        return Outcome(False, f"not sent: {what}: {exc.strerror or exc}")
    finally:
        if pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(pidfd)
    return Outcome(True, f"sent {what}")


def _pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid``, or None where the kernel or Python has none (then ``kill`` is used)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return int(opener(pid))
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL):  # no pidfds here (seccomp, old kernel)
            return None
        raise


__all__ = [
    "PROC",
    "SIGNALS",
    "Gone",
    "Outcome",
    "Target",
    "identify",
    "refusal",
    "send",
    "signal_name",
    "still_running",
]
