"""DeepSpeed ZeRO (stages 1-3): what its optimizer holds, named.

DeepSpeed's ZeRO optimizer (``engine.optimizer``: ``DeepSpeedZeroOptimizer`` for stages 1 and 2,
``DeepSpeedZeroOptimizer_Stage3``) wraps the torch optimizer (its ``.optimizer``) and keeps, besides the
torch optimizer's ``state``:

- **fp32 master weights**: flat fp32 partitions of the parameters (``single_partition_of_fp32_groups``,
  stages 1-2; ``fp32_partitioned_groups_flat``, stage 3) — the tensors the torch optimizer updates. A copy
  even of fp32 weights. They are optimizer states here (the guide's mixed-precision 4 B/param of master
  weights);
- **gradients** in its own flat buffers, never in ``param.grad``: ``averaged_gradients`` (the partition's
  reduced gradients, stages 1-2), ``grads_in_partition`` (stage 2's partition of contiguous gradients,
  where it keeps one), ``grad_partitions_flat_buffer`` (stage 3, kept between steps), and the fp32 ``.grad``
  of a master partition while the optimizer steps;
- **reduction buckets** (``ipg_buckets[dtype].buffer``: ``reduce_bucket_size`` elements, 5e8 by default,
  so 1 GB in bf16): stage 3 allocates them once and keeps them — communication buffers, as DDP's; stages
  1-2 allocate them at each backward's start and drop them by its end, so they are part of backward's
  temporaries;
- the model's weights as views of flat bit16 buffers (``bit16_groups_flat``: the parameters' own storage,
  counted once with the weights) or, under stage 3, as partitions (``param.ds_tensor``, which
  :func:`anatomy.hook.tensors.local_tensor` treats as the rank's shard, like FSDP2's local tensors).

Each storage is counted once across weights, gradients and optimizer states. The torch optimizer steps once
per parameter group inside the ZeRO optimizer's ``step``, so the tracker hooks the ZeRO optimizer's
``step`` itself (one optimizer phase per update, every group's work in it). Nothing here imports DeepSpeed:
it is recognised by its class's module and attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from anatomy.hook.distributed import Buckets
from anatomy.hook.tensors import storage_bytes, storage_key
from anatomy.vocabulary import Component, Precision

# Attributes holding the fp32 master weights (flat partitions), by ZeRO stage; the last is BF16_Optimizer's
# (bf16 without ZeRO partitioning: recognised, not tested).
MASTER_ATTRS = (
    "single_partition_of_fp32_groups",
    "fp32_partitioned_groups_flat",
    "fp32_groups_flat_partition",
)
# Attributes holding gradients outside ``param.grad``.
GRADIENT_ATTRS = (
    "averaged_gradients",
    "grads_in_partition",
    "grad_partitions_flat_buffer",
    "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
    "fp32_groups_gradients_flat",
)
_MASTER_BYTES_PER_PARAM = 4.0  # an fp32 copy of each parameter this rank updates
_STEP = "step"


def is_zero_optimizer(obj: Any) -> bool:
    """A DeepSpeed optimizer that keeps fp32 master partitions (ZeRO stages 1-3, BF16_Optimizer)."""
    module = type(obj).__module__ or ""
    return module.startswith("deepspeed.") and any(hasattr(obj, a) for a in MASTER_ATTRS)


def find_zero(*candidates: Any) -> Any | None:
    """The ZeRO optimizer among ``candidates`` or inside their wrappers: the engine's ``.optimizer``,
    accelerate's ``DeepSpeedOptimizerWrapper.optimizer``, or the object itself."""
    for obj in candidates:
        for _ in range(5):
            if obj is None:
                break
            if is_zero_optimizer(obj):
                return obj
            inner = getattr(obj, "optimizer", None)
            if inner is None or inner is obj:
                break
            obj = inner
    return None


def _tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif depth < 3 and isinstance(value, dict):
        for v in list(value.values()):
            yield from _tensors(v, depth + 1)
    elif depth < 3 and isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v, depth + 1)


def master_weights(zero: Any) -> list[torch.Tensor]:
    return [t for a in MASTER_ATTRS for t in _tensors(getattr(zero, a, None))]


def gradient_tensors(zero: Any) -> list[torch.Tensor]:
    """Every gradient DeepSpeed holds now: its buffers, and the masters' ``.grad`` during the step."""
    out = [t for a in GRADIENT_ATTRS for t in _tensors(getattr(zero, a, None))]
    out.extend(m.grad for m in master_weights(zero) if m.grad is not None)
    return out


def _sum_new(tensors: Iterator[torch.Tensor] | list[torch.Tensor], seen: set[int]) -> int:
    total = 0
    for t in tensors:
        key = storage_key(t)
        if key in seen:
            continue
        seen.add(key)
        total += storage_bytes(t)
    return total


def state_bytes(torch_optimizer: Any, zero: Any) -> int:
    """The torch optimizer's states (moments, step counters) plus the fp32 master partitions, each storage
    once (the masters are the state's keys, never its values)."""
    seen: set[int] = set()
    state = getattr(torch_optimizer, "state", None) or {}
    total = _sum_new(_tensors(list(state.values())), seen)
    return total + _sum_new(master_weights(zero), seen)


def gradient_bytes(params: list[torch.Tensor], zero: Any) -> int:
    """``param.grad`` where set (DeepSpeed clears them) plus DeepSpeed's gradient buffers, each storage
    once."""
    seen: set[int] = set()
    total = _sum_new([p.grad for p in params if p.grad is not None], seen)
    return total + _sum_new(gradient_tensors(zero), seen)


def buckets(zero: Any) -> Buckets | None:
    """The reduction buckets held now (stage 3 keeps its own; stages 1-2 hold them only inside backward),
    or None when there are none."""
    seen: set[int] = set()
    total = 0
    for bucket in list(getattr(zero, "ipg_buckets", {}).values()):
        total += _sum_new(list(_tensors(getattr(bucket, "buffer", None))), seen)
    return Buckets(total, are_gradients=False) if total else None


def world_size(zero: Any) -> int:
    """Ranks the optimizer's states are partitioned over (``partition_count``: an int in stage 3, a list
    per group in stages 1-2)."""
    count = getattr(zero, "partition_count", 1)
    if isinstance(count, (list, tuple)):
        count = max((c for c in count if isinstance(c, int)), default=1)
    return count if isinstance(count, int) and count > 0 else 1


def stage(zero: Any) -> int | None:
    if hasattr(zero, "fp32_partitioned_groups_flat"):
        return 3
    if hasattr(zero, "single_partition_of_fp32_groups"):
        return 2 if getattr(zero, "partition_gradients", False) else 1
    return None


def precision(param_dtype: torch.dtype, detected: Precision) -> Precision:
    """bit16 parameters with fp32 masters are mixed precision (the guide's sense), not pure bf16/fp16."""
    if param_dtype == torch.bfloat16:
        return Precision.BF16_MIXED
    if param_dtype == torch.float16:
        return Precision.FP16_MIXED
    return detected


def expected(
    table: dict[Component, float | None], zero: Any, param_bytes: int
) -> dict[Component, float | None]:
    """The guide's bytes/param, laid out as DeepSpeed lays memory out: weights are the parameters' own
    dtype (``param_bytes``; the guide's mixed-precision weight figure includes the 4 B master copy, which
    DeepSpeed keeps with the optimizer), optimizer states gain the 4 B/param fp32 master, gradients are
    held in the parameters' dtype. Stages 1-2 partition states and the reduced gradients (each rank keeps
    its partition's) over the ranks while weights stay whole, so those figures are per rank (÷ world size);
    stage 3's parameter count is the rank's partition already."""
    out = dict(table)
    n = world_size(zero)
    level = stage(zero)
    split = n if level in (1, 2) else 1
    opt = out.get(Component.OPTIMIZER_STATES)
    if opt is not None:
        out[Component.OPTIMIZER_STATES] = (opt + _MASTER_BYTES_PER_PARAM) / split
    if out.get(Component.WEIGHTS) is not None:
        out[Component.WEIGHTS] = float(param_bytes)
    if out.get(Component.GRADIENTS) is not None:
        out[Component.GRADIENTS] = float(param_bytes) / split
    return out


class _StepHandle:
    """Takes the ``step`` wrapper off again: the instance attribute that was there before (another
    wrapper) comes back, or none (the class's method)."""

    def __init__(self, zero: Any, wrapper: Callable[..., Any], previous: Any) -> None:
        self._zero = zero
        self._wrapper = wrapper
        self._previous = previous

    def remove(self) -> None:
        zero, self._zero = self._zero, None
        if zero is None or zero.__dict__.get(_STEP) is not self._wrapper:
            return  # gone, or wrapped again by someone else since: leave theirs in place
        if self._previous is None:
            del zero.__dict__[_STEP]
        else:
            zero.__dict__[_STEP] = self._previous


def hook_step(
    zero: Any, pre: Callable[[Any, Any, Any], Any], post: Callable[[Any, Any, Any], None]
) -> list[_StepHandle]:
    """Call ``pre``/``post`` (the tracker's optimizer hooks, which never raise) around the ZeRO optimizer's
    ``step``, as torch calls a step pre-hook: new ``(args, kwargs)`` from ``pre`` (a wrapped closure) are
    used; its own result and exceptions pass through unchanged."""
    previous = zero.__dict__.get(_STEP)  # someone's instance-level wrapper, if any
    original = zero.step  # the bound method, or that wrapper

    def step(*args: Any, **kwargs: Any) -> Any:
        new = pre(zero, args, kwargs)
        if new is not None:
            args, kwargs = new
        out = original(*args, **kwargs)
        post(zero, args, kwargs)
        return out

    zero.__dict__[_STEP] = step
    return [_StepHandle(zero, step, previous)]
