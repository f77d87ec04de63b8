"""What a distributed wrapper holds besides the model's own tensors.

DDP's reducer keeps one flat bucket per group of parameters, the size of their gradients. With
``gradient_as_bucket_view=True`` the gradients *are* views into those buckets (counted as gradients,
once); otherwise the buckets are a second copy that exists for the all-reduce: communication buffers.
Their sizes come from the reducer's own logging data (a torch-private accessor, read on refresh steps
only; absent or changed, the row is simply not shown). FSDP2's sharded parameters are DTensors: the
tensor sums count each rank's local shard (``anatomy.hook.tensors.local_tensor``), and its all-gathered
parameters are seen where the forward saves them (``anatomy.hook.saved``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Buckets:
    bytes: int  # all of DDP's buckets
    are_gradients: bool  # gradient_as_bucket_view: the buckets hold the gradients themselves


def ddp_buckets(model: Any) -> Buckets | None:
    """DDP's bucket bytes, or None for a model that is not wrapped in DistributedDataParallel."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return None
    data = model._get_ddp_logging_data()
    sizes = data.get("bucket_sizes", "")
    total = sum(int(s) for s in str(sizes).replace(",", " ").split() if s.strip().isdigit())
    return Buckets(total, bool(model.gradient_as_bucket_view))


def communication_bytes(buckets: Buckets | None, gradients: int) -> int | None:
    """Bytes of buckets that are not gradients right now: all of them without bucket views; with bucket
    views, what the gradients present do not cover (buckets exist before the first backward, and after
    ``zero_grad(set_to_none=True)``)."""
    if buckets is None:
        return None
    if not buckets.are_gradients:
        return buckets.bytes
    return max(buckets.bytes - gradients, 0)
