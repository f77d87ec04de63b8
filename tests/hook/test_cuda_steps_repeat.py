"""On CUDA an ordinary step repeats the last snapshot instead of building one, as on the CPU: a build
(named tensors, the split at the peak, the advisor) every step cost +0.9 ms a step on an H100 and an H200,
where the snapshot is read about twice a second. The allocator and CUDA events are stood in for on a CPU;
what must hold: steady steps build nothing, and a step whose peak moves is built, with its new peak."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import anatomy
from anatomy.hook.backend import CudaBackend
from anatomy.hook.cuda import CudaAllocator
from anatomy.hook.guard import Guard
from anatomy.hook.timing import StepClock
from tests.hook.cuda_standins import nested_stats

MIB = 1 << 20


class Event:
    """torch.cuda.Event's surface, completed as soon as recorded."""

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Event) -> float:
        return (end.t - self.t) * 1000.0


class Allocator:
    """The caching allocator's counters: what is allocated, and the peak (which only the user resets)."""

    def __init__(self) -> None:
        self.allocated = 100 * MIB
        self.peak = 180 * MIB

    def nested(self, device: Any = None) -> dict[str, Any]:
        return nested_stats(self.allocated, self.peak, reserved=256 * MIB)


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    alloc = Allocator()
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", alloc.nested)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: props.name)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    opt = torch.optim.AdamW(model.parameters())
    grow = {"by": 0}

    def forward_allocates(*_: Any) -> None:  # a temporary above the peak so far, when asked
        if grow["by"]:
            alloc.peak = max(alloc.peak, alloc.allocated + grow["by"])

    model.register_forward_hook(forward_allocates)

    def backend(device: torch.device, guard: Guard) -> CudaBackend:
        return CudaBackend(CudaAllocator(torch.device("cuda", 0)), guard)

    tracker = anatomy.Tracker(
        model,
        opt,
        publish=False,
        record=False,
        interval_s=3600.0,  # no rebuild by the clock during the test
        sample_every=0,
        memory_backend=backend,
        step_clock=lambda cuda: StepClock(True),
    )
    builds: list[int] = []
    build = tracker._build

    def counted(rec: Any, *args: Any, **kwargs: Any) -> Any:
        builds.append(-1 if rec is None else rec.index)
        return build(rec, *args, **kwargs)

    tracker._build = counted  # type: ignore[method-assign]
    x = torch.randn(16, 32)

    def steps(n: int) -> None:
        for _ in range(n):
            with tracker.step(samples=16):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

    yield SimpleNamespace(tracker=tracker, alloc=alloc, grow=grow, builds=builds, steps=steps)
    tracker.close()


def test_steady_cuda_steps_repeat_the_last_snapshot(on_cuda: SimpleNamespace) -> None:
    on_cuda.steps(60)
    built = [i for i in on_cuda.builds if i >= 0]
    assert built and max(built) < 10, built  # the first steps only
    snap = on_cuda.tracker.latest
    assert snap is not None and snap.step == 59  # the repeated snapshot carries each step's number
    assert snap.memory_source == "cuda_allocator"
    assert snap.timing.step_s is not None and snap.timing.step_s > 0


def test_a_cuda_step_whose_peak_moves_is_built_with_it(on_cuda: SimpleNamespace) -> None:
    on_cuda.steps(30)
    before = on_cuda.tracker.latest
    assert before is not None and before.peak_bytes is not None
    on_cuda.builds.clear()
    on_cuda.grow["by"] = 200 * MIB  # a longer sequence: a bigger temporary in the forward
    on_cuda.steps(1)
    assert on_cuda.builds == [30]
    after = on_cuda.tracker.latest
    assert after is not None and after.step == 30
    assert after.peak_bytes == on_cuda.alloc.allocated + 200 * MIB > before.peak_bytes
    on_cuda.steps(20)  # the same longer steps: repeated again
    assert on_cuda.builds == [30]
    latest = on_cuda.tracker.latest
    assert latest is not None and latest.step == 50 and latest.peak_bytes == after.peak_bytes


def test_a_user_who_resets_the_peak_each_step_still_gets_repeats(on_cuda: SimpleNamespace) -> None:
    """Every step's peak is then exact (measured on that step); the same figure is not a reason to build."""
    on_cuda.grow["by"] = 40 * MIB
    for _ in range(40):
        on_cuda.alloc.peak = on_cuda.alloc.allocated  # torch.cuda.reset_peak_memory_stats(), the user's
        on_cuda.steps(1)
    built = [i for i in on_cuda.builds if i >= 0]
    assert built and max(built) < 10, built
    snap = on_cuda.tracker.latest
    assert snap is not None and snap.step == 39
    assert snap.peak_bytes == on_cuda.alloc.allocated + 40 * MIB
