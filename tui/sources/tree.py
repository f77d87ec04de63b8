"""The process tree around the GPU processes: each one's chain of parents up to the root, and its own
children (data-loader workers, a launcher's ranks), read from /proc in one pass.

A training job is a tree (a shell, ``torchrun``, its ranks, their workers): NVML lists only the ranks,
so the tree is what says which job a GPU process belongs to and what to stop to stop the whole job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from anatomy.vocabulary import TreeRole
from tui.sources import procfs
from tui.sources.model import GpuProcess
from tui.sources.procfs import PROC, ProcReader, ProcStat

# The vocabulary's words, under the names the tree's readers import.
GPU, ANCESTOR, CHILD = TreeRole.GPU, TreeRole.ANCESTOR, TreeRole.CHILD


@dataclass(frozen=True)
class TreeRow:
    """One process of the tree, in display order (depth first, children by PID).

    ``last``: for each level from the root down to this row, whether that node is the last child of
    its parent: what a drawing needs for its ``├─``/``└─``/``│`` columns.
    """

    pid: int
    ppid: int
    depth: int
    last: tuple[bool, ...]
    role: TreeRole
    name: str | None = None
    user: str | None = None
    command: str | None = None
    cpu_percent: float | None = None
    host_rss: int | None = None
    running_time_s: float | None = None
    started_at: float | None = None
    gpus: tuple[int, ...] = ()  # the GPUs NVML lists it on
    gpu_memory: int | None = None  # summed over those GPUs
    alive: bool = True  # False: NVML lists it but /proc has no such process (exited, other namespace)


def _scan(proc: str) -> dict[int, ProcStat]:
    stats: dict[int, ProcStat] = {}
    try:
        entries = os.listdir(proc)
    except OSError:
        return stats
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = procfs.read_proc_stat(int(entry), proc)
        except (OSError, ValueError, IndexError):
            continue  # unreadable (hidepid) or exited mid-read
        if stat is not None and not procfs.is_gone(stat):
            stats[int(entry)] = stat
    return stats


class ProcessTree:
    """``build(gpu_processes)`` → the tree rows; keeps the last pass's CPU ticks, so from the second
    pass on CPU % covers the time between passes (the first pass shows N/A, as the process table)."""

    def __init__(self, proc: str = PROC, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc
        self._reader = ProcReader(proc)
        self._monotonic = monotonic
        self._last: dict[tuple[int, int], int] = {}  # (pid, start ticks) -> CPU ticks
        self._last_at: float | None = None

    def build(self, gpu_processes: Iterable[GpuProcess]) -> list[TreeRow]:
        on_gpu: dict[int, list[GpuProcess]] = {}
        for p in gpu_processes:
            on_gpu.setdefault(p.pid, []).append(p)
        now = self._monotonic()
        stats = _scan(self.proc)
        children: dict[int, list[int]] = {}
        for pid, stat in stats.items():
            children.setdefault(stat.ppid, []).append(pid)
        kept: dict[int, TreeRole] = {}
        for pid in on_gpu:
            kept[pid] = GPU
        for pid in on_gpu:
            parent = stats[pid].ppid if pid in stats else 0
            seen = {pid}
            while parent > 0 and parent in stats and parent not in seen:
                seen.add(parent)
                kept.setdefault(parent, ANCESTOR)
                parent = stats[parent].ppid
            for child in children.get(pid, ()):
                kept.setdefault(child, CHILD)
        parent_of = {pid: stats[pid].ppid if pid in stats else 0 for pid in kept}
        kids: dict[int, list[int]] = {}
        roots = []
        for pid in kept:
            if parent_of[pid] in kept and parent_of[pid] != pid:
                kids.setdefault(parent_of[pid], []).append(pid)
            else:
                roots.append(pid)
        elapsed = None if self._last_at is None else now - self._last_at
        rows: list[TreeRow] = []

        def visit(pid: int, depth: int, last: tuple[bool, ...]) -> None:
            rows.append(self._row(pid, depth, last, kept[pid], stats.get(pid), on_gpu.get(pid, []), elapsed))
            below = sorted(kids.get(pid, ()))
            for i, child in enumerate(below):
                visit(child, depth + 1, (*last, i == len(below) - 1))

        ordered_roots = sorted(roots)
        for i, root in enumerate(ordered_roots):
            visit(root, 0, (i == len(ordered_roots) - 1,))
        self._last = {(pid, s.start_ticks): s.cpu_ticks for pid, s in stats.items() if pid in kept}
        self._last_at = now
        return rows

    def _row(
        self,
        pid: int,
        depth: int,
        last: tuple[bool, ...],
        role: TreeRole,
        stat: ProcStat | None,
        gpu: list[GpuProcess],
        elapsed: float | None,
    ) -> TreeRow:
        memories = [p.gpu_memory for p in gpu if p.gpu_memory is not None]
        common = {
            "pid": pid,
            "depth": depth,
            "last": last,
            "role": role,
            "gpus": tuple(sorted({p.gpu_index for p in gpu})),
            "gpu_memory": sum(memories) if memories else None,
        }
        if stat is None:  # NVML lists it, /proc does not: what the process table knew
            known = gpu[0] if gpu else None
            return TreeRow(
                ppid=0,
                alive=False,
                name=known.name if known else None,
                user=known.user if known else None,
                command=known.command if known else None,
                **common,  # type: ignore[arg-type]
            )
        reader = self._reader
        cmdline = reader.cmdline(pid)
        cpu = None
        before = self._last.get((pid, stat.start_ticks))
        if before is not None and elapsed:
            cpu = max(0.0, round((stat.cpu_ticks - before) / reader.clock_ticks / elapsed * 100, 1))
        try:
            started: float | None = reader.created(stat)
        except (OSError, ValueError):
            started = None
        try:
            rss = reader.resident_bytes(pid)
        except (OSError, ValueError, IndexError):
            rss = None
        return TreeRow(
            ppid=stat.ppid,
            name=procfs.full_name(stat.comm, cmdline),
            user=reader.user_of(pid),
            command=" ".join(cmdline) if cmdline else f"[{stat.comm}]",
            cpu_percent=cpu,
            host_rss=rss,
            running_time_s=None if started is None else max(0.0, time.time() - started),
            started_at=started,
            **common,  # type: ignore[arg-type]
        )


__all__ = ["ANCESTOR", "CHILD", "GPU", "ProcessTree", "TreeRow"]
