"""The CUDA memory reader: the caching allocator's counters for one device.

Reads only — never ``reset_peak_memory_stats``: the process-wide peak belongs to the user (their own
``torch.cuda.max_memory_allocated()``, the Trainer's memory metrics). Host-side counters: no read
synchronizes with the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class CudaStats:
    allocated: int
    reserved: int
    peak_allocated: int
    alloc_retries: int
    ooms: int


@dataclass(frozen=True, slots=True)
class CudaReading:
    allocated: int  # now
    peak: int  # the process-wide peak since the last reset (by anyone but us)


def _stat(stats: dict[str, Any], key: str) -> int:
    return int(stats.get(key, 0))


class CudaAllocator:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def reading(self) -> CudaReading:
        s = torch.cuda.memory_stats(self.device)
        return CudaReading(_stat(s, "allocated_bytes.all.current"), _stat(s, "allocated_bytes.all.peak"))

    def stats(self) -> CudaStats:
        s = torch.cuda.memory_stats(self.device)
        return CudaStats(
            allocated=_stat(s, "allocated_bytes.all.current"),
            reserved=_stat(s, "reserved_bytes.all.current"),
            peak_allocated=_stat(s, "allocated_bytes.all.peak"),
            alloc_retries=_stat(s, "num_alloc_retries"),
            ooms=_stat(s, "num_ooms"),
        )
