"""The CUDA memory reader: the caching allocator's counters for one device."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CudaStats:
    allocated: int
    reserved: int
    peak_allocated: int
    alloc_retries: int
    ooms: int


class CudaAllocator:
    """The caching allocator's counters for one device. Host-side reads: none synchronizes."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def peak_and_reset(self) -> int:
        """Peak allocated since the last reset, then start a new peak window."""
        peak = int(torch.cuda.max_memory_allocated(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak

    def stats(self) -> CudaStats:
        s = torch.cuda.memory_stats(self.device)
        return CudaStats(
            allocated=int(s.get("allocated_bytes.all.current", 0)),
            reserved=int(s.get("reserved_bytes.all.current", 0)),
            peak_allocated=int(s.get("allocated_bytes.all.peak", 0)),
            alloc_retries=int(s.get("num_alloc_retries", 0)),
            ooms=int(s.get("num_ooms", 0)),
        )
