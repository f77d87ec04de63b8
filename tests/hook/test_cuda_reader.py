"""The CUDA memory reader takes its counters from the allocator's nested statistics, and they are the very
figures ``torch.cuda.memory_stats()`` / ``memory_allocated()`` give: torch's own functions flatten the same
nested dictionary, so feeding both one dictionary (the structure the C++ allocator returns) must give equal
numbers — on a CPU, where the allocator itself cannot run."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.cuda.memory as cuda_memory

from anatomy.hook.cuda import CudaAllocator


def _pools(current: int, peak: int) -> dict[str, dict[str, int]]:
    one = {"current": current, "peak": peak, "allocated": peak * 3, "freed": peak * 3 - current}
    half = {k: v // 2 for k, v in one.items()}
    return {"all": one, "small_pool": half, "large_pool": {k: one[k] - half[k] for k in one}}


def _nested() -> dict[str, Any]:
    """The shape of ``torch._C._cuda_memoryStats``: counters per statistic and pool, and a few scalars."""
    return {
        "num_alloc_retries": 3,
        "num_ooms": 1,
        "num_sync_all_streams": 0,
        "num_device_alloc": 17,
        "num_device_free": 2,
        "allocation": _pools(40, 90),
        "segment": _pools(7, 9),
        "active": _pools(40, 90),
        "inactive_split": _pools(2, 5),
        "allocated_bytes": _pools(123_456_789, 234_567_890),
        "reserved_bytes": _pools(300_000_000, 310_000_000),
        "active_bytes": _pools(123_456_789, 234_567_890),
        "inactive_split_bytes": _pools(1_000, 2_000),
        "requested_bytes": _pools(120_000_000, 230_000_000),
        "oversize_allocations": {"current": 0, "peak": 0, "allocated": 0, "freed": 0},
        "oversize_segments": {"current": 0, "peak": 0, "allocated": 0, "freed": 0},
    }


@pytest.fixture
def nested(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    stats = _nested()
    calls: list[Any] = []

    def fake(device: Any = None) -> dict[str, Any]:
        calls.append(device)
        return stats

    # torch.cuda.memory_stats (and so memory_allocated) flattens what torch.cuda.memory's own global returns;
    # the reader calls the one re-exported on torch.cuda
    monkeypatch.setattr(cuda_memory, "memory_stats_as_nested_dict", fake)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", fake)
    stats["_calls"] = calls
    return stats


def test_the_readings_are_torch_s_own_flattened_figures(nested: dict[str, Any]) -> None:
    calls = nested.pop("_calls")
    flat = torch.cuda.memory_stats(0)
    reader = CudaAllocator(torch.device("cuda", 0))
    assert reader.allocated() == flat["allocated_bytes.all.current"] == torch.cuda.memory_allocated(0)
    assert reader.current_and_peak() == (
        flat["allocated_bytes.all.current"],
        flat["allocated_bytes.all.peak"],
    )
    stats = reader.stats()
    assert stats.allocated == flat["allocated_bytes.all.current"]
    assert stats.reserved == flat["reserved_bytes.all.current"]
    assert stats.peak_allocated == flat["allocated_bytes.all.peak"]
    assert stats.alloc_retries == flat["num_alloc_retries"] == 3
    assert stats.ooms == flat["num_ooms"] == 1
    # every reader call asked for its own device, once: one dictionary per read, not one per figure
    assert calls.count(torch.device("cuda", 0)) == 3


def test_an_allocator_not_yet_started_reads_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    # memory_stats_as_nested_dict's answer before CUDA is initialized (as on this CPU build)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device=None: {})
    reader = CudaAllocator(torch.device("cuda", 0))
    assert reader.allocated() == 0
    assert reader.current_and_peak() == (0, 0)
    stats = reader.stats()
    assert (stats.allocated, stats.reserved, stats.alloc_retries, stats.ooms) == (0, 0, 0, 0)


def test_a_figure_missing_from_an_older_allocator_reads_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        torch.cuda,
        "memory_stats_as_nested_dict",
        lambda device=None: {"allocated_bytes": {"all": {"current": 5}}, "reserved_bytes": {}},
    )
    stats = CudaAllocator(torch.device("cuda", 0)).stats()
    assert (stats.allocated, stats.peak_allocated, stats.reserved, stats.ooms) == (5, 0, 0, 0)


def test_with_torch_s_own_function_in_place_the_binding_is_called_with_the_device_index(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No stand-in on torch.cuda: a read skips torch's Python wrapper and asks the C++ binding (absent
    from this CPU build: stood in for here) for the device's index, once CUDA is initialized."""
    from anatomy.hook import cuda

    stats = _nested()
    asked: list[Any] = []

    def binding(index: int) -> dict[str, Any]:
        asked.append(index)
        return stats

    monkeypatch.setattr(cuda, "_RAW", binding)
    monkeypatch.setattr(cuda, "_TORCH_NESTED", torch.cuda.memory_stats_as_nested_dict)
    initialized = [False]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized[0])
    reader = CudaAllocator(torch.device("cuda", 3))
    # before CUDA is initialized: torch's own function, which answers {} then
    assert reader.current_and_peak() == (0, 0) and asked == []
    initialized[0] = True
    assert reader.current_and_peak() == (123_456_789, 234_567_890)
    assert reader.stats().reserved == 300_000_000
    assert asked == [3, 3]
    # a stand-in patched over torch's function is what is read (the tests' simulated allocators)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device=None: {})
    assert reader.current_and_peak() == (0, 0) and asked == [3, 3]
