"""One-shot host facts read straight from Linux's /proc, for ``anatomy-top --once``.

The live monitor enriches processes through psutil (``tui.sources.processes``/``host``), which keeps
per-PID objects between refreshes for CPU %. A one-shot report has no previous refresh, so it needs
none of that, and importing psutil alone costs more than reading every GPU process's four small
/proc files. The values are psutil's, computed the way psutil computes them on Linux (tests compare
the two); anywhere else ``available()`` is False and the caller uses the psutil path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import replace

from tui.sources.model import GpuProcess, HostInfo

PROC = "/proc"


def available(proc: str = PROC) -> bool:
    return sys.platform.startswith("linux") and os.path.isdir(os.path.join(proc, "self"))


def _read(path: str) -> bytes:
    # os-level calls: no file object per read (three reads per GPU process add up). /proc files
    # report size 0, so read until EOF.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class _Gone(Exception):
    """The process exited, is a zombie, or is not in this PID namespace."""


class ProcReader:
    """Reads what ``ProcessEnricher`` reports for a PID, with no psutil and no state across calls.

    CPU % is None (N/A), as in the enricher's first refresh: it needs two samples.
    """

    def __init__(self, proc: str = PROC, now: float | None = None) -> None:
        import time

        self.proc = proc
        self.now = time.time() if now is None else now
        self._ticks = os.sysconf("SC_CLK_TCK")
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._boot: float | None = None
        self._users: dict[int, str] = {}

    def boot_time(self) -> float:
        if self._boot is None:
            for line in _read(os.path.join(self.proc, "stat")).splitlines():
                if line.startswith(b"btime"):
                    self._boot = float(line.split()[1])
                    break
            else:
                raise OSError("no btime in /proc/stat")
        return self._boot

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

    def facts(self, pid: int) -> dict[str, object] | None:
        """The enrichment fields for ``pid``, or None when it is gone."""
        if pid <= 0:
            return None
        base = os.path.join(self.proc, str(pid))
        try:
            stat = _read(base + "/stat")
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return None
        except OSError:
            stat = b""
        try:
            comm, rest = self._parse_stat(stat)
        except _Gone:
            return None
        except (ValueError, IndexError):
            comm, rest = None, []
        cmdline = self._cmdline(base)
        name = comm
        if name is not None and len(name) >= 15 and cmdline:
            # comm is cut at 15 characters; psutil takes the full name from argv[0] when it matches.
            full = os.path.basename(cmdline[0])
            if full.startswith(name):
                name = full
        created = None
        if len(rest) > 19:
            try:
                created = self.boot_time() + int(rest[19]) / self._ticks
            except (OSError, ValueError):
                created = None
        return {
            "name": name,
            "user": self._user_of(base),
            "command": " ".join(cmdline) if cmdline else None,
            "cpu_percent": None,
            "host_rss": self._rss(base),
            "running_time_s": None if created is None else max(0.0, self.now - created),
            "alive": True,
        }

    @staticmethod
    def _parse_stat(stat: bytes) -> tuple[str | None, list[bytes]]:
        if not stat:
            return None, []
        # The name sits in parentheses and may itself contain ") ": split at the last one.
        left, right = stat.find(b"("), stat.rfind(b")")
        rest = stat[right + 2 :].split()
        if rest and rest[0] == b"Z":
            raise _Gone
        return _text(stat[left + 1 : right]), rest

    @staticmethod
    def _cmdline(base: str) -> list[str] | None:
        try:
            data = _text(_read(base + "/cmdline"))
        except OSError:
            return None
        if not data:
            return []
        # psutil's rules: NUL-separated, unless a process rewrote its argv with spaces.
        sep = "\x00" if data.endswith("\x00") else " "
        if data.endswith(sep):
            data = data[:-1]
        parts = data.split(sep)
        if sep == "\x00" and len(parts) == 1 and " " in data:
            parts = data.split(" ")
        return parts

    def _rss(self, base: str) -> int | None:
        # statm, as psutil: stat's rss field is a different, approximate, counter on recent kernels.
        try:
            return int(_read(base + "/statm").split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return None

    def _user_of(self, base: str) -> str | None:
        try:
            status = _read(base + "/status")
        except OSError:
            return None
        start = status.find(b"\nUid:") + 1  # 0 when not found after a newline
        if start == 0 and not status.startswith(b"Uid:"):
            return None
        try:
            real_uid = int(status[start + 4 :].split(None, 1)[0])  # real, effective, saved, fs
        except (ValueError, IndexError):
            return None
        return self.user(real_uid)


def enrich(processes: Iterable[GpuProcess], reader: ProcReader | None = None) -> tuple[GpuProcess, ...]:
    """``ProcessEnricher.enrich`` for one refresh: each PID is looked up once; gone → ``alive=False``."""
    reader = reader or ProcReader()
    by_pid: dict[int, dict[str, object] | None] = {}
    out = []
    for proc in processes:
        if proc.pid not in by_pid:
            try:
                by_pid[proc.pid] = reader.facts(proc.pid)
            except Exception:  # an unreadable process is N/A, never a crash
                by_pid[proc.pid] = {"alive": True}
        facts = by_pid[proc.pid]
        out.append(replace(proc, alive=False) if facts is None else replace(proc, **facts))  # type: ignore[arg-type]
    return tuple(out)


def _meminfo(proc: str) -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    for line in _read(os.path.join(proc, "meminfo")).splitlines():
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


__all__ = ["ProcReader", "available", "enrich", "host"]
