"""The host beside the GPUs: CPU, memory, swap, load and name, through psutil. Every failure is N/A."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import TypeVar

import psutil

from tui.sources.model import HostInfo

T = TypeVar("T")


def _safe(read: Callable[[], T]) -> T | None:
    try:
        return read()
    except Exception:  # psutil raises OSError, AccessDenied, RuntimeError…: all mean N/A here
        return None


class HostSource:
    """Samples the host. CPU % needs an interval, so the first snapshot reports it as N/A (None)
    rather than psutil's meaningless first 0.0; later snapshots cover the time since the previous one.
    """

    def __init__(self) -> None:
        self._primed = False
        self._hostname: str | None = None
        self._cpu_count: int | None = None

    def snapshot(self) -> HostInfo:
        cpu = _safe(lambda: psutil.cpu_percent(interval=None))
        if not self._primed:
            self._primed = True
            cpu = None
        if self._hostname is None:
            self._hostname = _safe(socket.gethostname)
        if self._cpu_count is None:
            self._cpu_count = _safe(psutil.cpu_count)
        memory = _safe(psutil.virtual_memory)
        swap = _safe(psutil.swap_memory)
        load = _safe(os.getloadavg)
        return HostInfo(
            cpu_percent=cpu,
            cpu_count=self._cpu_count,
            memory_total=None if memory is None else int(memory.total),
            memory_used=None if memory is None else int(memory.total - memory.available),
            memory_available=None if memory is None else int(memory.available),
            swap_total=None if swap is None else int(swap.total),
            swap_used=None if swap is None else int(swap.used),
            load_avg=None if load is None else (float(load[0]), float(load[1]), float(load[2])),
            hostname=self._hostname,
        )
