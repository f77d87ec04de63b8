"""Enrich NVML's GPU processes with what the host knows: user, command line, CPU %, RSS, running time.

A monitor refreshes every second or two, so the per-process cost matters (64 processes on an 8-GPU box).
What never changes for a process (command line, user, name, start time) is read once per PID through
psutil and cached; each refresh then reads only ``/proc/<pid>/stat`` (CPU times, start time, name) and
``/proc/<pid>/statm`` (RSS) where Linux has them, instead of psutil's five or six reads per process.
The cached facts are read again when the PID was recycled (another start time), when the process exec'd
(another name), and every ``STATIC_TTL_S`` (setproctitle, setuid). Elsewhere every figure comes from
psutil each refresh.

CPU % covers the interval since the previous refresh (the first sample is N/A, as with psutil). A process
that exited between NVML's list and this lookup comes back ``alive=False`` with N/A fields; another user's
(or container's) process gives whatever is readable, the rest N/A.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

import psutil

from tui.sources.model import GpuProcess

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


@dataclass(frozen=True)
class ProcStat:
    """The fields of one ``/proc/<pid>/stat`` read that a refresh needs."""

    comm: str
    state: str
    cpu_ticks: int  # utime + stime, in clock ticks
    start_ticks: int  # since boot, in clock ticks: with the PID, identifies the process
    rss_pages: int  # approximate on recent kernels (per-CPU counters): see read_resident_pages


def parse_proc_stat(data: bytes) -> ProcStat:
    """Parse ``/proc/<pid>/stat`` (proc(5)). The name may hold spaces and parentheses, hence rfind."""
    open_paren, close_paren = data.index(b"("), data.rindex(b")")
    comm = data[open_paren + 1 : close_paren].decode("utf-8", "replace")
    fields = data[close_paren + 2 :].split()  # fields[0] is field 3 (state) of proc(5)
    return ProcStat(
        comm=comm,
        state=fields[0].decode("ascii", "replace"),
        cpu_ticks=int(fields[11]) + int(fields[12]),  # utime (14), stime (15)
        start_ticks=int(fields[19]),  # starttime (22)
        rss_pages=int(fields[21]),  # rss (24)
    )


def _read_small(path: str) -> bytes | None:
    """One small /proc file in one read (os-level: no file object, this runs per process per refresh);
    None where the process is gone. PermissionError and other OSErrors propagate."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        return None
    try:
        return os.read(fd, 4096)  # stat: 52 numbers and a name of at most 64 bytes; statm: 7 numbers
    except ProcessLookupError:  # exited between open and read
        return None
    finally:
        os.close(fd)


def read_proc_stat(pid: int) -> ProcStat | None:
    """None where the process is gone; PermissionError and other OSErrors propagate."""
    data = _read_small(f"/proc/{pid}/stat")
    return None if data is None else parse_proc_stat(data)


def read_resident_pages(pid: int) -> int | None:
    """Resident pages from ``/proc/<pid>/statm``, as psutil's ``memory_info().rss``. The ``rss`` of
    ``/proc/<pid>/stat`` is the kernel's per-CPU approximation on recent kernels (off by a few
    hundred KiB on a small process), so it is not used."""
    data = _read_small(f"/proc/{pid}/statm")
    return None if data is None else int(data.split()[1])


@dataclass
class _Known:
    """What one PID's earlier refreshes learned."""

    stat: ProcStat
    static: dict[str, object]  # name, user, command: read through psutil
    static_at: float  # monotonic time the static facts were read
    sampled_at: float  # monotonic time of ``stat``


class ProcessEnricher:
    def __init__(
        self, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._monotonic = monotonic
        self._fast = os.path.exists("/proc/self/stat")
        self._clk_tck = os.sysconf("SC_CLK_TCK") if self._fast else 100
        self._page_size = os.sysconf("SC_PAGE_SIZE") if self._fast else 4096
        self._boot_time: float | None = None
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

    def _lookup(self, pid: int) -> dict[str, object] | None:
        if pid <= 0:
            return None
        if self._fast:
            try:
                return self._lookup_proc(pid)
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

    def _boot(self) -> float:
        if self._boot_time is None:
            self._boot_time = psutil.boot_time()
        return self._boot_time

    def _lookup_proc(self, pid: int) -> dict[str, object]:
        stat = read_proc_stat(pid)
        if stat is None or stat.state in ("Z", "X"):  # a zombie has exited: only its parent holds it
            raise _Gone
        now = self._monotonic()
        known = self._cache.get(pid)
        if not isinstance(known, _Known) or known.stat.start_ticks != stat.start_ticks:
            known = None  # new to us, or a recycled PID
        cpu: float | None = None
        if known is not None and now > known.sampled_at:
            cpu = round(
                (stat.cpu_ticks - known.stat.cpu_ticks) / self._clk_tck / (now - known.sampled_at) * 100, 1
            )
            cpu = max(0.0, cpu)
        if known is None or known.stat.comm != stat.comm or now - known.static_at >= STATIC_TTL_S:
            static = self._read_static(pid)
            static_at = now
        else:
            static, static_at = known.static, known.static_at
        self._cache[pid] = _Known(stat=stat, static=static, static_at=static_at, sampled_at=now)
        created = self._boot() + stat.start_ticks / self._clk_tck
        resident = read_resident_pages(pid)
        if resident is None:
            raise _Gone
        return {
            **static,
            "cpu_percent": cpu,
            "host_rss": resident * self._page_size,
            "running_time_s": max(0.0, self._clock() - created),
            "alive": True,
        }

    def _read_static(self, pid: int) -> dict[str, object]:
        try:
            proc = psutil.Process(pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            raise _Gone from None
        with proc.oneshot():
            name = _field(proc.name)
            user = _field(proc.username)
            cmdline = _field(proc.cmdline)
        return {"name": name, "user": user, "command": " ".join(cmdline) if cmdline else None}

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
            "alive": True,
        }
