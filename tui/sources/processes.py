"""Enrich NVML's GPU processes with what the host knows: user, command line, CPU %, RSS, running time.

psutil.Process objects are cached per PID so ``cpu_percent`` measures the interval since the previous
refresh. A process that exited between NVML's list and this lookup comes back ``alive=False`` with N/A
fields; another user's (or container's) process gives whatever is readable, the rest N/A.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TypeVar

import psutil

from tui.sources.model import GpuProcess

T = TypeVar("T")


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


class ProcessEnricher:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._cache: dict[int, psutil.Process] = {}
        # PIDs whose cpu_percent has been primed (psutil's first call has no interval: reported N/A).
        self._primed: set[int] = set()

    def enrich(self, processes: Iterable[GpuProcess]) -> tuple[GpuProcess, ...]:
        procs = tuple(processes)
        seen = {p.pid for p in procs}
        for pid in list(self._cache):
            if pid not in seen:
                del self._cache[pid]
                self._primed.discard(pid)
        by_pid: dict[int, dict[str, object] | None] = {}
        out = []
        for proc in procs:
            if proc.pid not in by_pid:  # a PID on several GPUs is looked up once per refresh
                by_pid[proc.pid] = self._lookup(proc.pid)
            facts = by_pid[proc.pid]
            if facts is None:
                out.append(replace(proc, alive=False))
            else:
                out.append(replace(proc, **facts))  # type: ignore[arg-type]
        return tuple(out)

    def _process(self, pid: int) -> psutil.Process:
        cached = self._cache.get(pid)
        # is_running() compares create times, so a recycled PID gets a fresh object.
        if cached is not None and cached.is_running():
            return cached
        self._primed.discard(pid)
        proc = psutil.Process(pid)
        self._cache[pid] = proc
        return proc

    def _lookup(self, pid: int) -> dict[str, object] | None:
        try:
            if pid <= 0:
                raise _Gone
            try:
                proc = self._process(pid)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                raise _Gone from None
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
            self._cache.pop(pid, None)
            self._primed.discard(pid)
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
            "alive": True,
        }
