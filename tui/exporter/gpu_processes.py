"""Every GPU process of the node, for the per-process series: who holds a GPU, whether or not it publishes
an anatomy.

NVML lists each process per GPU with its memory and, where the GPU samples processes, its SM and
memory-bandwidth share; /proc adds its resident host memory and its command. Labels stay bounded: the
PID and the command — cleaned (no control characters, whitespace collapsed) and capped at
``COMMAND_CHARS`` — and at most ``max_processes`` processes per node, those holding the most GPU memory
first (the rest are counted, not exported). A process that leaves NVML's list leaves the next scrape, and
its command is forgotten: nothing grows with the processes a node has seen.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tui.sanitize import clean
from tui.sources import procfs
from tui.sources.model import GpuProcess

MAX_PROCESSES = 128  # per node; --max-processes
COMMAND_CHARS = 64  # of the command label
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class NodeProcess:
    """One process on the node's GPUs: its NVML entries (one per GPU it uses) and host figures."""

    pid: int
    command: str
    entries: tuple[GpuProcess, ...]
    rss_bytes: int | None


def command_label(argv: Sequence[str] | None, comm: str | None) -> str:
    """``python train.py --lr 3e-4`` from argv (the program by its base name), else the kernel's name;
    control characters escaped, whitespace collapsed, at most ``COMMAND_CHARS`` characters."""
    words = [w for w in (argv or ()) if w]
    if words:
        words[0] = os.path.basename(words[0]) or words[0]
        text = " ".join(words)
    else:
        text = comm or ""
    text = " ".join(clean(text).split())
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 1] + "…"


def _read_command(pid: int, proc: str) -> str:
    try:
        data = procfs.read_file(f"{proc}/{pid}/cmdline")
        argv = procfs.parse_cmdline(data) if data is not None else None
        comm = None
        if not argv:  # a kernel thread or a zombie: no argv, the name in comm
            raw = procfs.read_file(f"{proc}/{pid}/comm")
            comm = raw.decode("utf-8", "replace").strip() if raw is not None else None
    except OSError:  # another user's process without the rights to read it
        return ""
    return command_label(argv, comm)


def _read_rss(pid: int, proc: str) -> int | None:
    try:
        pages = procfs.read_resident_pages(pid, proc)
    except (OSError, ValueError, IndexError):
        return None
    return None if pages is None else pages * _PAGE_SIZE


class NodeProcesses:
    """Turns one NVML reading's process entries into ``NodeProcess``es; keeps each listed PID's command
    (read once: a command line rarely changes) and forgets it when the PID leaves NVML's list."""

    def __init__(
        self,
        max_processes: int = MAX_PROCESSES,
        proc: str = procfs.PROC,
        read_command: Callable[[int, str], str] = _read_command,
    ) -> None:
        self.max_processes = max_processes
        self._proc = proc
        self._read_command = read_command
        self._commands: dict[int, str] = {}
        self._host = procfs.available(proc)

    def read(self, entries: Sequence[GpuProcess]) -> tuple[list[NodeProcess], int]:
        """The processes to export, largest GPU memory first, and how many more were left out."""
        by_pid: dict[int, list[GpuProcess]] = {}
        for entry in entries:
            by_pid.setdefault(entry.pid, []).append(entry)
        for gone in [pid for pid in self._commands if pid not in by_pid]:
            del self._commands[gone]
        order = sorted(by_pid, key=lambda pid: (-sum(e.gpu_memory or 0 for e in by_pid[pid]), pid))
        kept = order[: max(self.max_processes, 0)]
        out = []
        for pid in kept:
            command = self._commands.get(pid)
            if command is None and self._host:
                command = self._commands[pid] = self._read_command(pid, self._proc)
            rss = _read_rss(pid, self._proc) if self._host else None
            out.append(NodeProcess(pid, command or "", tuple(by_pid[pid]), rss))
        return out, len(order) - len(kept)
