"""glibc's heap in use follows tensor allocations."""

from __future__ import annotations

import torch

from anatomy.hook.heap import HostHeap


def test_host_heap_tracks_tensor_allocations() -> None:
    heap = HostHeap()
    assert heap.available  # glibc with mallinfo2 on this platform
    before = heap.in_use()
    assert before is not None
    t = torch.ones(8 * 1024 * 1024, dtype=torch.uint8)  # 8 MiB
    during = heap.in_use()
    assert during is not None and during - before >= t.numel()
    del t
    after = heap.in_use()
    assert after is not None and during - after >= 8 * 1024 * 1024


def test_the_traces_reader_reads_what_in_use_reads() -> None:
    """``reader()`` (the per-op trace's closure) gives the same bytes as ``in_use()`` and follows the same
    allocations; where the heap cannot be read it reads None, as ``in_use`` does."""
    heap = HostHeap()
    read = heap.reader()
    assert read() == heap.in_use()
    before = read()
    assert before is not None
    t = torch.ones(8 * 1024 * 1024, dtype=torch.uint8)
    during = read()
    assert during is not None and during - before >= t.numel() and during == heap.in_use()
    del t
    heap.available = False
    assert heap.reader()() is None and heap.in_use() is None
