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
