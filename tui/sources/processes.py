"""Enrich NVML's GPU processes with what the host knows: user, command line, CPU %, RSS, running time.

A monitor refreshes every second or two, so the per-process cost matters (64 processes on an 8-GPU box).
Where Linux's /proc is readable, everything comes from ``tui.sources.procfs`` (the parser ``--once`` uses
too): what never changes for a process (command line, user, name) is read once per PID and cached; each
refresh then reads only ``/proc/<pid>/stat`` (CPU times, start time, name) and ``/proc/<pid>/statm``
(RSS), instead of psutil's five or six reads per process.
The cached facts are read again when the PID was recycled (another start time), when the process exec'd
(another name), and every ``STATIC_TTL_S`` (setproctitle, setuid). Elsewhere, or where a process's stat
is unreadable (hidepid), every figure comes from psutil each refresh.

CPU % covers the interval since the previous refresh (the first sample is N/A, as with psutil). A process
that exited between NVML's list and this lookup comes back ``alive=False`` with N/A fields; another user's
(or container's) process gives whatever is readable, the rest N/A.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import psutil

from tui.sources import procfs
from tui.sources.model import GpuProcess
from tui.sources.procfs import ProcStat

T = TypeVar("T")
STATIC_TTL_S = 60.0  # how long cached command line and user are trusted without another sign of change


class _Gone(Exception):
    """The process no longer exists (or never existed in our PID namespace)."""


def _field(read: Callable[[], T]) -> T | None:
    """One readable-or-N/A field; an exited process aborts the whole lookup."""
    try:
        return read()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        raise _Gone from None
    except Exception:  # AccessDenied and OS errors: this field is N/A, the rest may be readable
        return None


@dataclass
class _Known:
    """What one PID's earlier refreshes learned."""

    stat: ProcStat
    static: dict[str, object]  # name, user, command
    static_at: float  # monotonic time the static facts were read
    sampled_at: float  # monotonic time of ``stat``


class ProcessEnricher:
    def __init__(
        self, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._monotonic = monotonic
        # /proc readable: the fast path (the same parser as --once); elsewhere psutil does it all.
        self._reader = procfs.ProcReader() if procfs.available() else None
        # Per PID: psutil.Process (fallback path, so cpu_percent has an interval) or _Known (fast path).
        self._cache: dict[int, psutil.Process | _Known] = {}
        # PIDs whose cpu_percent has been primed (psutil's first call has no interval: reported N/A).
        self._primed: set[int] = set()

    def enrich(self, processes: Iterable[GpuProcess]) -> tuple[GpuProcess, ...]:
        procs = tuple(processes)
        seen = {p.pid for p in procs}
        for pid in list(self._cache):
            if pid not in seen:
                del self._cache[pid]
                self._primed.discard(pid)
        return procfs.apply(procs, self._lookup)

    @property
    def known_pids(self) -> frozenset[int]:
        """The PIDs whose facts are kept for the next refresh (those of the last ``enrich``)."""
        return frozenset(self._cache)

    def path_of(self, pid: int) -> str | None:
        """How the last refresh read ``pid``: "procfs" (the fast path), "psutil" (the fallback: /proc
        unreadable, or another system), or None where nothing is kept for it."""
        cached = self._cache.get(pid)
        if cached is None:
            return None
        return "procfs" if isinstance(cached, _Known) else "psutil"

    def _lookup(self, pid: int) -> dict[str, object] | None:
        if pid <= 0:
            return None
        if self._reader is not None:
            try:
                return self._lookup_proc(pid, self._reader)
            except _Gone:
                self._forget(pid)
                return None
            except Exception:  # unreadable stat (hidepid, odd kernel): psutil says what it can
                if isinstance(self._cache.get(pid), _Known):
                    del self._cache[pid]
        return self._lookup_psutil(pid)

    def _forget(self, pid: int) -> None:
        self._cache.pop(pid, None)
        self._primed.discard(pid)

    # -- fast path: one /proc read per refresh ------------------------------------------------------

    def _lookup_proc(self, pid: int, reader: procfs.ProcReader) -> dict[str, object]:
        stat = reader.stat(pid)
        if stat is None or procfs.is_gone(stat):
            raise _Gone
        now = self._monotonic()
        known = self._cache.get(pid)
        if not isinstance(known, _Known) or known.stat.start_ticks != stat.start_ticks:
            known = None  # new to us, or a recycled PID
        cpu: float | None = None
        if known is not None and now > known.sampled_at:
            elapsed = now - known.sampled_at
            cpu = round((stat.cpu_ticks - known.stat.cpu_ticks) / reader.clock_ticks / elapsed * 100, 1)
            cpu = max(0.0, cpu)
        if known is None or known.stat.comm != stat.comm or now - known.static_at >= STATIC_TTL_S:
            static = reader.static(pid, stat.comm)
            static_at = now
        else:
            static, static_at = known.static, known.static_at
        self._cache[pid] = _Known(stat=stat, static=static, static_at=static_at, sampled_at=now)
        resident = reader.resident_bytes(pid)
        if resident is None:
            raise _Gone
        created = reader.created(stat)
        return {
            **static,
            "cpu_percent": cpu,
            "host_rss": resident,
            "running_time_s": max(0.0, self._clock() - created),
            "started_at": created,
            "alive": True,
        }

    # -- psutil path: every figure each refresh (no /proc, or /proc unreadable) ---------------------

    def _process(self, pid: int) -> psutil.Process:
        cached = self._cache.get(pid)
        # is_running() compares create times, so a recycled PID gets a fresh object.
        if isinstance(cached, psutil.Process) and cached.is_running():
            return cached
        self._primed.discard(pid)
        proc = psutil.Process(pid)
        self._cache[pid] = proc
        return proc

    def _lookup_psutil(self, pid: int) -> dict[str, object] | None:
        try:
            try:
                proc = self._process(pid)
            except Exception:
                raise _Gone from None
            with proc.oneshot():
                name = _field(proc.name)
                user = _field(proc.username)
                cmdline = _field(proc.cmdline)
                cpu = _field(lambda: proc.cpu_percent(interval=None))
                memory = _field(proc.memory_info)
                created = _field(proc.create_time)
        except _Gone:
            self._forget(pid)
            return None
        if pid not in self._primed:
            self._primed.add(pid)
            cpu = None
        command = " ".join(cmdline) if cmdline else None
        return {
            "name": name,
            "user": user,
            "command": command,
            "cpu_percent": cpu,
            "host_rss": None if memory is None else int(memory.rss),
            "running_time_s": None if created is None else max(0.0, self._clock() - created),
            "started_at": created,
            "alive": True,
        }
