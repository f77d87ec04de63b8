"""Paged optimizer states: bitsandbytes' paged optimizers (``PagedAdamW8bit``, ``PagedAdamW``, ...) keep
their states in CUDA managed memory (``cudaMallocManaged``), outside torch's caching allocator.

bitsandbytes wraps each such buffer as a tensor marked ``is_paged = True`` (``bitsandbytes.functional.
get_paged``; torch sees a host tensor over the managed pointer). On CUDA those bytes are neither in the
allocator's figures nor in the at-peak rows (which sum to the allocator's peak): they are published as their
own figure (``CudaMemory.managed``), which the monitor takes out of NVML's per-process figure before what is
left is called CUDA context.
"""

from __future__ import annotations

from typing import Any

import torch

from anatomy.hook.tensors import storage_bytes, storage_key, unwrap_optimizer


def is_paged(t: torch.Tensor) -> bool:
    return getattr(t, "is_paged", False) is True


def _tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if depth < 4 and isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v, depth + 1)]
    if depth < 4 and isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v, depth + 1)]
    return []


def paged_state_bytes(optimizer: Any) -> int:
    """Bytes of the optimizer's paged (managed-memory) state tensors, each storage once."""
    state = getattr(unwrap_optimizer(optimizer), "state", None)
    if not state:
        return 0
    seen: set[int] = set()
    total = 0
    for t in _tensors(list(state.values())):
        if not is_paged(t):
            continue
        key = storage_key(t)
        if key not in seen:
            seen.add(key)
            total += storage_bytes(t)
    return total
