"""Recent history of what the monitor shows: per GPU (utilization, memory used) and per GPU process
(GPU memory, SM %, memory-bandwidth %, CPU %, host memory), one sample per refresh, bounded.

Kept in the data layer so every view (the GPU sparklines, the process metrics screen) reads the same
series, and a view opened late still has the minutes before it. A GPU is keyed by its UUID (an index can
change meaning when a GPU falls off the bus and the driver reloads); a process by GPU, PID and start
time, so a recycled PID starts a new series.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from tui.sources.model import GpuInfo, GpuProcess, MachineSnapshot

DEFAULT_LENGTH = 300  # samples: 10 minutes at the default 2 s refresh
# A process absent for this many refreshes is forgotten (a series per PID would otherwise grow forever).
FORGET_AFTER = 30

GPU_SERIES = ("gpu_util", "memory_percent")
PROCESS_SERIES = ("gpu_memory", "sm_util", "memory_bw_util", "cpu_percent", "host_rss")


class Series:
    """Values (None = N/A at that refresh) with their times, oldest first, at most ``length``."""

    __slots__ = ("times", "values")

    def __init__(self, length: int) -> None:
        self.times: deque[float] = deque(maxlen=length)
        self.values: deque[float | None] = deque(maxlen=length)

    def add(self, t: float, value: float | None) -> None:
        self.times.append(t)
        self.values.append(value)

    def last(self, n: int | None = None) -> list[float | None]:
        values = list(self.values)
        return values if n is None else values[-n:] if n > 0 else []

    def latest(self) -> float | None:
        return self.values[-1] if self.values else None

    def peak(self) -> float | None:
        present = [v for v in self.values if v is not None]
        return max(present) if present else None

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class ProcessKey:
    gpu_index: int
    pid: int
    started_at: float | None


def gpu_key(gpu: GpuInfo) -> str:
    return gpu.uuid or f"index:{gpu.index}"


def memory_percent(gpu: GpuInfo) -> float | None:
    if gpu.memory_used is None or not gpu.memory_total:
        return None
    return 100.0 * gpu.memory_used / gpu.memory_total


class MachineHistory:
    """``record(snapshot)`` once per refresh; then ``gpu(info)`` and ``process(proc)`` give the series."""

    def __init__(self, length: int = DEFAULT_LENGTH) -> None:
        if length < 1:
            raise ValueError("a history holds at least one sample")
        self.length = length
        self._gpus: dict[str, dict[str, Series]] = {}
        self._processes: dict[ProcessKey, dict[str, Series]] = {}
        self._absent: dict[ProcessKey, int] = {}
        self.recorded = 0  # snapshots recorded

    def record(self, snapshot: MachineSnapshot) -> None:
        t = snapshot.time
        for gpu in snapshot.gpus:
            series = self._gpus.setdefault(gpu_key(gpu), self._new(GPU_SERIES))
            series["gpu_util"].add(t, None if gpu.lost else gpu.gpu_util)
            series["memory_percent"].add(t, None if gpu.lost else memory_percent(gpu))
        seen: set[ProcessKey] = set()
        for proc in snapshot.processes:
            key = self._key(proc)
            if key in seen:  # one row per (GPU, PID): MIG instances of one PID add up
                continue
            seen.add(key)
            series = self._processes.setdefault(key, self._new(PROCESS_SERIES))
            for name in PROCESS_SERIES:
                series[name].add(t, getattr(proc, name))
        self._forget(seen)
        self.recorded += 1

    def gpu(self, gpu: GpuInfo) -> dict[str, Series] | None:
        return self._gpus.get(gpu_key(gpu))

    def process(self, proc: GpuProcess) -> dict[str, Series] | None:
        return self._processes.get(self._key(proc))

    def process_keys(self) -> Iterable[ProcessKey]:
        return tuple(self._processes)

    def _new(self, names: tuple[str, ...]) -> dict[str, Series]:
        return {name: Series(self.length) for name in names}

    @staticmethod
    def _key(proc: GpuProcess) -> ProcessKey:
        return ProcessKey(proc.gpu_index, proc.pid, proc.started_at)

    def _forget(self, seen: set[ProcessKey]) -> None:
        for key in list(self._processes):
            if key in seen:
                self._absent.pop(key, None)
                continue
            self._absent[key] = self._absent.get(key, 0) + 1
            if self._absent[key] >= FORGET_AFTER:
                del self._processes[key]
                del self._absent[key]


__all__ = [
    "DEFAULT_LENGTH",
    "FORGET_AFTER",
    "GPU_SERIES",
    "PROCESS_SERIES",
    "MachineHistory",
    "ProcessKey",
    "Series",
    "gpu_key",
    "memory_percent",
]
