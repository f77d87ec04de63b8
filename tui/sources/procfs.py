"""Process and host facts read straight from Linux's /proc: the one parser both paths share.

``anatomy-top --once`` uses ``enrich`` and ``host`` (importing psutil alone costs more than reading every
GPU process's few small /proc files); the live monitor's ``ProcessEnricher`` uses ``ProcReader`` for its
per-refresh stat/statm reads and its per-PID static facts. The values are psutil's, computed the way
psutil computes them on Linux (tests compare the two); anywhere else ``available()`` is False and the
callers use psutil. No psutil import here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from tui.sources.model import GpuProcess, HostInfo

PROC = "/proc"


def available(proc: str = PROC) -> bool:
    return sys.platform.startswith("linux") and os.path.isdir(os.path.join(proc, "self"))


def read_file(path: str) -> bytes | None:
    """A whole /proc file, or None where the process is gone; PermissionError and other OSErrors
    propagate. os-level calls: no file object (this runs per process per refresh). /proc files report
    size 0, so read until EOF."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    except ProcessLookupError:  # exited between open and read
        return None
    finally:
        os.close(fd)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ProcStat:
    """The fields of one ``/proc/<pid>/stat`` read that a refresh needs."""

    comm: str
    state: str
    ppid: int
    cpu_ticks: int  # utime + stime, in clock ticks
    start_ticks: int  # since boot, in clock ticks: with the PID, identifies the process
    rss_pages: int  # approximate on recent kernels (per-CPU counters): see read_resident_pages


def parse_proc_stat(data: bytes) -> ProcStat:
    """Parse ``/proc/<pid>/stat`` (proc(5)). The name may hold spaces and ") ", hence rindex.
    ValueError/IndexError on a malformed line."""
    open_paren, close_paren = data.index(b"("), data.rindex(b")")
    fields = data[close_paren + 2 :].split()  # fields[0] is field 3 (state) of proc(5)
    return ProcStat(
        comm=_text(data[open_paren + 1 : close_paren]),
        state=fields[0].decode("ascii", "replace"),
        ppid=int(fields[1]),  # ppid (4)
        cpu_ticks=int(fields[11]) + int(fields[12]),  # utime (14), stime (15)
        start_ticks=int(fields[19]),  # starttime (22)
        rss_pages=int(fields[21]),  # rss (24)
    )


def read_proc_stat(pid: int, proc: str = PROC) -> ProcStat | None:
    """None where the process is gone; PermissionError and other OSErrors propagate."""
    data = read_file(f"{proc}/{pid}/stat")
    return None if data is None else parse_proc_stat(data)


def read_resident_pages(pid: int, proc: str = PROC) -> int | None:
    """Resident pages from ``/proc/<pid>/statm``, as psutil's ``memory_info().rss``. The ``rss`` of
    ``/proc/<pid>/stat`` is the kernel's per-CPU approximation on recent kernels (off by a few
    hundred KiB on a small process), so it is not used."""
    data = read_file(f"{proc}/{pid}/statm")
    return None if data is None else int(data.split()[1])


def parse_cmdline(data: bytes) -> list[str]:
    """psutil's rules: NUL-separated, unless a process rewrote its argv with spaces."""
    text = _text(data)
    if not text:
        return []
    sep = "\x00" if text.endswith("\x00") else " "
    if text.endswith(sep):
        text = text[:-1]
    parts = text.split(sep)
    if sep == "\x00" and len(parts) == 1 and " " in text:
        parts = text.split(" ")
    return parts


def full_name(comm: str, cmdline: list[str] | None) -> str:
    """comm is cut at 15 characters; psutil takes the full name from argv[0] when it matches."""
    if len(comm) >= 15 and cmdline:
        full = os.path.basename(cmdline[0])
        if full.startswith(comm):
            return full
    return comm


def is_gone(stat: ProcStat | None) -> bool:
    """No such process, or a zombie (it has exited: only its parent holds it)."""
    return stat is None or stat.state in ("Z", "X")


class ProcReader:
    """Reads a PID's facts from /proc with no psutil. Caches only what never changes (boot time,
    uid → user name); ``facts`` keeps no state between calls (CPU % is None: it needs two samples).
    """

    def __init__(self, proc: str = PROC, now: float | None = None) -> None:
        import time

        self.proc = proc
        self.now = time.time() if now is None else now
        self.clock_ticks = os.sysconf("SC_CLK_TCK")
        self.page_size = os.sysconf("SC_PAGE_SIZE")
        self._boot: float | None = None
        self._users: dict[int, str] = {}

    def boot_time(self) -> float:
        """btime of /proc/stat, as psutil.boot_time() on Linux."""
        if self._boot is None:
            for line in (read_file(os.path.join(self.proc, "stat")) or b"").splitlines():
                if line.startswith(b"btime"):
                    self._boot = float(line.split()[1])
                    break
            else:
                raise OSError("no btime in /proc/stat")
        return self._boot

    def created(self, stat: ProcStat) -> float:
        """The process's start, in seconds since the epoch."""
        return self.boot_time() + stat.start_ticks / self.clock_ticks

    def user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            import pwd

            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:  # no passwd entry (containers): psutil answers the number too
                name = str(uid)
            self._users[uid] = name
        return name

    def stat(self, pid: int) -> ProcStat | None:
        return read_proc_stat(pid, self.proc)

    def resident_bytes(self, pid: int) -> int | None:
        pages = read_resident_pages(pid, self.proc)
        return None if pages is None else pages * self.page_size

    def cmdline(self, pid: int) -> list[str] | None:
        """None where unreadable."""
        try:
            data = read_file(f"{self.proc}/{pid}/cmdline")
        except OSError:
            return None
        return None if data is None else parse_cmdline(data)

    def uid_of(self, pid: int) -> int | None:
        """The real uid (the owner, as psutil's uids().real); None where unreadable or gone."""
        try:
            status = read_file(f"{self.proc}/{pid}/status")
        except OSError:
            return None
        if status is None:
            return None
        start = status.find(b"\nUid:") + 1  # 0 when not found after a newline
        if start == 0 and not status.startswith(b"Uid:"):
            return None
        try:
            return int(status[start + 4 :].split(None, 1)[0])  # real, effective, saved, fs
        except (ValueError, IndexError):
            return None

    def user_of(self, pid: int) -> str | None:
        """The owner of the real uid (as psutil's username()); None where unreadable."""
        uid = self.uid_of(pid)
        return None if uid is None else self.user(uid)

    def static(self, pid: int, comm: str | None) -> dict[str, object]:
        """What does not change while a process runs (unless it execs or renames itself)."""
        cmdline = self.cmdline(pid)
        return {
            "name": None if comm is None else full_name(comm, cmdline),
            "user": self.user_of(pid),
            "command": " ".join(cmdline) if cmdline else None,
        }

    def facts(self, pid: int) -> dict[str, object] | None:
        """The enrichment fields for ``pid`` (CPU % None), or None when it is gone."""
        if pid <= 0:
            return None
        stat: ProcStat | None
        try:
            stat = self.stat(pid)
        except (OSError, ValueError, IndexError):  # unreadable or odd: the rest may still be readable
            stat = None
        else:
            if is_gone(stat):
                return None
        created = None
        if stat is not None:
            try:
                created = self.created(stat)
            except (OSError, ValueError):
                created = None
        try:
            rss = self.resident_bytes(pid)
        except (OSError, ValueError, IndexError):
            rss = None
        return {
            **self.static(pid, None if stat is None else stat.comm),
            "cpu_percent": None,
            "host_rss": rss,
            "running_time_s": None if created is None else max(0.0, self.now - created),
            "started_at": created,
            "alive": True,
        }


def apply(
    processes: Iterable[GpuProcess], lookup: Callable[[int], dict[str, object] | None]
) -> tuple[GpuProcess, ...]:
    """NVML's processes with ``lookup(pid)``'s fields: each PID (one per GPU it uses) is looked up once;
    None → ``alive=False``; a lookup that raises leaves the row as NVML gave it (N/A, never a crash)."""
    by_pid: dict[int, dict[str, object] | None] = {}
    out = []
    for proc in processes:
        if proc.pid not in by_pid:
            try:
                by_pid[proc.pid] = lookup(proc.pid)
            except Exception:
                by_pid[proc.pid] = {"alive": True}
        facts = by_pid[proc.pid]
        out.append(replace(proc, alive=False) if facts is None else replace(proc, **facts))  # type: ignore[arg-type]
    return tuple(out)


def enrich(processes: Iterable[GpuProcess], reader: ProcReader | None = None) -> tuple[GpuProcess, ...]:
    """``ProcessEnricher.enrich`` for a first (and only) refresh."""
    reader = reader or ProcReader()
    return apply(processes, reader.facts)


def _meminfo(proc: str) -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    for line in (read_file(os.path.join(proc, "meminfo")) or b"").splitlines():
        key, _, value = line.partition(b":")
        fields = value.split()
        if fields:
            out[key] = int(fields[0]) * 1024  # kB
    return out


def host(proc: str = PROC) -> HostInfo:
    """``HostSource().snapshot()`` for a first (and only) snapshot: CPU % is N/A, the rest from /proc."""
    try:
        memory = _meminfo(proc)
    except (OSError, ValueError):
        memory = {}
    total = memory.get(b"MemTotal")
    available_ = memory.get(b"MemAvailable")
    swap_total, swap_free = memory.get(b"SwapTotal"), memory.get(b"SwapFree")
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    try:
        hostname: str | None = os.uname().nodename  # what gethostname() returns on Linux
    except OSError:
        hostname = None
    mem_ok = total is not None and available_ is not None
    return HostInfo(
        cpu_percent=None,
        cpu_count=os.cpu_count(),
        memory_total=total,
        memory_used=total - available_ if mem_ok else None,  # type: ignore[operator]
        memory_available=available_,
        swap_total=swap_total,
        swap_used=swap_total - swap_free if swap_total is not None and swap_free is not None else None,
        load_avg=None if load is None else (float(load[0]), float(load[1]), float(load[2])),
        hostname=hostname or None,
    )


__all__ = [
    "ProcReader",
    "ProcStat",
    "apply",
    "available",
    "enrich",
    "host",
    "parse_cmdline",
    "parse_proc_stat",
    "read_proc_stat",
    "read_resident_pages",
]
