"""The tracker's CUDA memory path, driven by a simulated caching allocator on CPU.

No GPU here, so the allocator is simulated: "allocated" is glibc's heap in use (minus a constant
non-tensor base), and its peak is tracked after every aten op by a dispatch mode — the statistics a
real caching allocator keeps. Through that, the tracker's CUDA arithmetic (per-phase peak windows,
temporaries, unattributed, allocator cache, CudaMemory) must agree with its CPU path on the same model.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import anatomy
from anatomy.memory import CudaStats, HostHeap
from anatomy.vocabulary import Component

CACHE = 3 * 1024 * 1024  # the simulated allocator keeps this much reserved beyond what is allocated


class SimulatedAllocator(TorchDispatchMode):
    def __init__(self, heap: HostHeap, base: int) -> None:
        super().__init__()
        self.heap = heap
        self.base = base
        self.peak = 0
        self.resets = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.peak = max(self.peak, self.allocated())
        return out

    def allocated(self) -> int:
        now = self.heap.in_use()
        assert now is not None
        return now - self.base

    def peak_and_reset(self) -> int:
        now = self.allocated()
        peak = max(self.peak, now)
        self.peak = now
        self.resets += 1
        return peak

    def stats(self) -> CudaStats:
        now = self.allocated()
        return CudaStats(
            allocated=now, reserved=now + CACHE, peak_allocated=self.peak, alloc_retries=2, ooms=0
        )


def _run(hk: SimpleNamespace, simulated: bool) -> Any:
    batch = hk.bert_batch(batch=8)
    model = hk.small_bert()
    opt = torch.optim.AdamW(model.parameters())
    hk.train_steps(model, opt, 1, batch=batch)  # optimizer state exists before tracking
    tracker = anatomy.track(model, opt, publish=False, sample_every=1)
    alloc = None
    if simulated:
        heap = HostHeap()
        tensors = sum(p.numel() * 4 for p in model.parameters()) + sum(
            t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
        )
        tensors += sum(b.numel() * b.element_size() for b in model.buffers())
        now = heap.in_use()
        assert now is not None
        alloc = SimulatedAllocator(heap, base=now - tensors)
        tracker._cuda = True  # the CUDA path, with the simulated allocator and no CUDA events
        tracker._heap = None
        tracker._allocator = alloc
        tracker._disabled.add("timing")
        with alloc:
            hk.train_steps(model, opt, 3, tracker, batch=batch)
    else:
        hk.train_steps(model, opt, 3, tracker, batch=batch)
    snap = tracker.latest
    tracker.close()
    return snap, alloc


def test_cuda_memory_arithmetic_agrees_with_cpu_path(hk: SimpleNamespace) -> None:
    cpu, _ = _run(hk, simulated=False)
    cuda, alloc = _run(hk, simulated=True)
    assert alloc is not None and alloc.resets >= 3 * 4  # a peak window per phase boundary, per step
    assert cuda.memory_source == "cuda_allocator" and cpu.memory_source == "glibc"
    for c in (Component.WEIGHTS, Component.OPTIMIZER_STATES, Component.GRADIENTS, Component.ACTIVATIONS):
        assert cuda.memory[c.value] == cpu.memory[c.value]
    assert cuda.peak_phase == cpu.peak_phase
    assert cuda.peak_bytes == pytest.approx(cpu.peak_bytes, rel=0.03)
    temporaries = cuda.memory[Component.TEMPORARIES.value]
    assert temporaries is not None and temporaries > 1_000_000
    assert temporaries == pytest.approx(cpu.memory[Component.TEMPORARIES.value], rel=0.05)
    assert cuda.memory[Component.ALLOCATOR_CACHE.value] == CACHE
    assert cuda.memory[Component.CUDA_CONTEXT.value] is None  # the monitor derives it from NVML
    assert cuda.cuda is not None
    assert cuda.cuda.reserved - cuda.cuda.allocated == CACHE
    assert cuda.cuda.peak_allocated == cuda.peak_bytes and cuda.cuda.alloc_retries == 2
