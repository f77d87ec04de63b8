"""The tracker's CUDA memory path, driven by a stand-in for ``torch.cuda``'s allocator statistics on CPU.

No GPU here, so the caching allocator's counters are simulated and patched in where torch.cuda has
them (``memory_stats_as_nested_dict``, ``memory_allocated``, ``max_memory_allocated``,
``reset_peak_memory_stats``):
"allocated" is glibc's heap in use (minus a constant non-tensor base), and the peak is tracked after
every aten op by a dispatch mode — the statistics a real caching allocator keeps. Through that, the
tracker's CUDA arithmetic (phase peaks, temporaries, unattributed, allocator cache, CudaMemory) must
agree with its CPU path on the same model, and the user's own peak readings must be what they are
without the hook. CUDA events are simulated too, to show phase times are read only once the events
completed.
"""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import anatomy
from anatomy.hook.backend import CudaBackend
from anatomy.hook.cuda import CudaAllocator
from anatomy.hook.guard import Guard
from anatomy.hook.heap import HostHeap
from anatomy.hook.timing import StepClock
from anatomy.peaks import peak_flops
from anatomy.vocabulary import Component, Precision
from tests.hook.cuda_standins import nested_stats

cuda_hello: list[Any] = []
CACHE = 3 * 1024 * 1024  # the simulated allocator keeps this much reserved beyond what is allocated


class SimulatedCuda(TorchDispatchMode):
    """The caching allocator's counters: allocated now, its peak since the last reset, every reading."""

    def __init__(self, heap: HostHeap, base: int) -> None:
        super().__init__()
        self.heap = heap
        self.base = base
        self.peak = 0
        self.readings: list[int] = []  # allocated after every op and at every read, in order
        self.resets: list[int] = []  # len(readings) at each reset

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._now()
        return out

    def _now(self) -> int:
        now = self.heap.in_use()
        assert now is not None
        now -= self.base
        self.readings.append(now)
        self.peak = max(self.peak, now)
        return now

    # torch.cuda's functions
    def memory_allocated(self, device: Any = None) -> int:
        return self._now()

    def max_memory_allocated(self, device: Any = None) -> int:
        self._now()
        return self.peak

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.peak = self._now()
        self.resets.append(len(self.readings))

    def memory_stats_as_nested_dict(self, device: Any = None) -> dict[str, Any]:
        now = self._now()
        return nested_stats(now, self.peak, reserved=now + CACHE, retries=2)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        names = (
            "memory_allocated",
            "max_memory_allocated",
            "reset_peak_memory_stats",
            "memory_stats_as_nested_dict",
        )
        for name in names:
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))


def _simulated(model: torch.nn.Module, opt: torch.optim.Optimizer) -> SimulatedCuda:
    """A simulated allocator that holds the model and its optimizer state, and little else."""
    heap = HostHeap()
    tensors = sum(p.numel() * 4 for p in model.parameters()) + sum(
        t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
    )
    tensors += sum(b.numel() * b.element_size() for b in model.buffers())
    now = heap.in_use()
    assert now is not None
    return SimulatedCuda(heap, base=now - tensors)


def _on_simulated_cuda(device: torch.device, guard: Guard) -> CudaBackend:
    """The memory backend of a model on the CPU, as if it were on ``cuda:0`` (the allocator simulated);
    the step's clock stays the host's (the device is the CPU): there are no CUDA events to record."""
    return CudaBackend(CudaAllocator(torch.device("cuda", 0)), guard)


def _run(hk: SimpleNamespace, sim: pytest.MonkeyPatch | None) -> Any:
    # Garbage left by earlier tests of the suite, collected in the middle of a step, would lower the CPU
    # path's heap readings (the heap shrinks while the step allocates): measure from a collected heap,
    # with no cyclic collection during the steps.
    gc.collect()
    gc.disable()
    try:
        return _train(hk, sim)
    finally:
        gc.enable()


def _train(hk: SimpleNamespace, sim: pytest.MonkeyPatch | None) -> Any:
    batch = hk.bert_batch(batch=8)
    model = hk.small_bert()
    opt = torch.optim.AdamW(model.parameters())
    hk.train_steps(model, opt, 1, batch=batch)  # optimizer state exists before tracking
    backend = _on_simulated_cuda if sim is not None else None
    # step 1 profiled, step 2 traced (the sampled episode's instruments, one a step), step 3 not sampled
    tracker = anatomy.Tracker(model, opt, publish=False, sample_every=5, memory_backend=backend)
    cuda = None
    if sim is not None:
        cuda = _simulated(model, opt)
        cuda.install(sim)
        with cuda:
            hk.train_steps(model, opt, 4, tracker, batch=batch)
    else:
        hk.train_steps(model, opt, 4, tracker, batch=batch)
    snap = tracker.latest
    cuda_hello[:] = [tracker.hello]
    tracker.close()
    return snap, cuda


H100 = "NVIDIA H100 80GB HBM3"


def test_cuda_memory_arithmetic_agrees_with_cpu_path(
    hk: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu, _ = _run(hk, None)
    props = SimpleNamespace(name=H100, total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: H100)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    cuda, alloc = _run(hk, monkeypatch)
    assert alloc is not None and alloc.resets == []  # the allocator's peak is the user's: never reset
    assert cuda.memory_source == "cuda_allocator" and cpu.memory_source == "glibc"
    for c in (Component.WEIGHTS, Component.OPTIMIZER_STATES, Component.GRADIENTS, Component.ACTIVATIONS):
        assert cuda.memory[c.value] == cpu.memory[c.value]
    assert cuda.peak_phase == cpu.peak_phase
    # The CPU peak is the whole heap; the simulated allocator starts near the training tensors. Without
    # what each held outside the training tensors (runtime, unattributed), the two peaks agree.
    for snap in (cpu, cuda):
        assert snap.at_peak is not None and snap.peak_bytes is not None
        assert sum(v or 0 for v in snap.at_peak.values()) == snap.peak_bytes
        assert all(v is not None and v >= 0 for v in snap.at_peak.values())
    assert cuda.at_peak is not None and cpu.at_peak is not None and cuda.peak_bytes and cpu.peak_bytes

    def outside(snap: Any) -> int:
        return sum(snap.at_peak.get(c.value) or 0 for c in (Component.UNATTRIBUTED, Component.RUNTIME))

    assert cuda.peak_bytes - outside(cuda) == pytest.approx(cpu.peak_bytes - outside(cpu), rel=0.03)
    assert Component.RUNTIME.value not in cuda.at_peak and cuda.memory[Component.RUNTIME.value] is None
    # the same split at the peak: the CUDA path traces allocated bytes per op like the CPU path the heap
    for c in (Component.WEIGHTS, Component.OPTIMIZER_STATES, Component.GRADIENTS, Component.ACTIVATIONS):
        assert cuda.at_peak[c.value] == cpu.at_peak[c.value], c
    assert cuda.at_peak_step == cpu.at_peak_step == 2  # the traced step's split, reused on step 3
    temporaries = cuda.memory[Component.TEMPORARIES.value]
    assert temporaries is not None and temporaries > 1_000_000
    assert temporaries == pytest.approx(cpu.memory[Component.TEMPORARIES.value], rel=0.05)
    assert cuda.memory[Component.ALLOCATOR_CACHE.value] == CACHE
    assert cuda.memory[Component.CUDA_CONTEXT.value] is None  # the monitor derives it from NVML
    assert cuda.cuda is not None
    assert cuda.cuda.reserved - cuda.cuda.allocated == CACHE
    assert cuda.cuda.peak_allocated == cuda.peak_bytes and cuda.cuda.alloc_retries == 2
    # MFU: achieved FLOP/s over the GPU's peak for the precision (TF32 as torch is set up).
    hello = cuda_hello[0]
    assert hello.device_name == H100 and hello.device_memory_bytes == 80 * 2**30
    assert hello.tf32 is not None
    peak = peak_flops(H100, Precision.FP32, tf32=hello.tf32)
    assert peak and cuda.achieved_tflops
    assert cuda.mfu == pytest.approx(cuda.achieved_tflops * 1e12 / peak)
    assert cuda.error is None


class FakeEvent:
    """torch.cuda.Event's surface: record() now, query() False until the 'device' catches up."""

    completed = False

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.t: float | None = None

    def record(self) -> None:
        import time

        self.t = time.perf_counter()

    def query(self) -> bool:
        return FakeEvent.completed

    def elapsed_time(self, end: FakeEvent) -> float:
        assert FakeEvent.completed, "read before the event completed"
        assert self.t is not None and end.t is not None
        return (end.t - self.t) * 1000.0


def test_cuda_event_timing_is_resolved_lazily_without_sync(
    hk: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_sync(*args: object) -> None:
        raise AssertionError("the hot path must never synchronize")

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    FakeEvent.completed = False
    model = hk.small_bert(vocab=2000)
    opt = torch.optim.AdamW(model.parameters())
    batch = hk.bert_batch()
    batch["input_ids"] = batch["input_ids"] % 2000

    def on_events(cuda: bool) -> StepClock:  # the CPU model's steps timed with (fake) CUDA events
        return StepClock(cuda=True)

    tracker = anatomy.Tracker(model, opt, publish=False, sample_every=0, step_clock=on_events)
    hk.train_steps(model, opt, 3, tracker, batch=batch)
    pending = tracker.latest
    assert pending is not None and pending.timing.step_s is None  # nothing completed yet: unknown
    FakeEvent.completed = True
    hk.train_steps(model, opt, 1, tracker, batch=batch)
    done = tracker.latest
    tracker.close()
    assert done is not None and done.step == 3
    t = done.timing
    assert t.step_s and t.forward_s and t.backward_s and t.optimizer_s
    assert t.forward_s + t.backward_s + t.optimizer_s <= t.step_s * 1.0001
    assert tracker.throughput.timing_step == 3 and not tracker.throughput.pending  # all resolved
    assert t.samples_per_s == pytest.approx(hk.BATCH / t.step_s)


def _tracked_on_simulated_cuda(
    hk: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> tuple[torch.nn.Module, torch.optim.Optimizer, anatomy.Tracker, SimulatedCuda, dict[str, torch.Tensor]]:
    batch = hk.bert_batch(batch=8)
    model = hk.small_bert(vocab=2000)
    batch["input_ids"] = batch["input_ids"] % 2000
    opt = torch.optim.AdamW(model.parameters())
    hk.train_steps(model, opt, 1, batch=batch)
    tracker = anatomy.Tracker(model, opt, publish=False, sample_every=3, memory_backend=_on_simulated_cuda)
    cuda = _simulated(model, opt)
    cuda.install(monkeypatch)
    props = SimpleNamespace(name=H100, total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    return model, opt, tracker, cuda, batch


def test_the_users_peak_reading_is_what_it_is_without_the_hook(
    hk: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user who never resets reads the process-wide peak; the hook never resets it under them."""
    model, opt, tracker, cuda, batch = _tracked_on_simulated_cuda(hk, monkeypatch)
    read, truth = [], []
    with cuda:
        for _ in range(5):
            hk.train_steps(model, opt, 1, tracker, batch=batch)
            read.append(torch.cuda.max_memory_allocated())
            truth.append(max(cuda.readings))  # every reading the allocator took, none forgotten
    tracker.close()
    assert cuda.resets == []
    assert read == truth


def test_a_user_resetting_each_step_reads_that_steps_peak(
    hk: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Trainer's memory metrics (and many loops) reset the peak, run, and read it: the reading is
    the maximum since their own reset. The hook's step peak is then exact on every step."""
    model, opt, tracker, cuda, batch = _tracked_on_simulated_cuda(hk, monkeypatch)
    read, truth, snaps = [], [], []
    with cuda:
        for _ in range(5):
            torch.cuda.reset_peak_memory_stats()
            mark = len(cuda.readings) - 1  # the reading the reset took
            hk.train_steps(model, opt, 1, tracker, batch=batch)
            read.append(torch.cuda.max_memory_allocated())
            truth.append(max(cuda.readings[mark:]))
            snaps.append(tracker.latest)
    tracker.close()
    assert len(cuda.resets) == 5  # the user's own, and only those
    assert read == truth
    for snap, users_peak in zip(snaps, read, strict=True):
        assert snap is not None and snap.peak_bytes is not None and snap.error is None
        assert snap.peak_bytes == pytest.approx(users_peak, rel=0.01)  # (the sim counts Python garbage too)
