"""Model states from shapes alone: weights, gradients, optimizer states and the optimizer step's own
temporaries. Exact by construction (``numel * element_size`` of the model built on the meta
device); the optimizer figures follow each implementation's allocations."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from anatomy.plan.config import num_layers
from anatomy.plan.settings import OPTIMIZERS, PlanError, Target

CUDA_BLOCK = 512  # the CUDA caching allocator rounds every allocation up to 512 bytes
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes keeps 32-bit states for smaller tensors
BNB_BLOCK = 256  # bitsandbytes blockwise quantization: one fp32 absmax per 256 values


def allocation_bytes(nbytes: int, target: Target) -> int:
    """What one allocation of ``nbytes`` takes on the target (CUDA rounds up to its block)."""
    if target == Target.CUDA and nbytes > 0:
        return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK
    return nbytes


@dataclass(frozen=True)
class ParamShape:
    shape: tuple[int, ...]
    element_size: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.element_size


@dataclass(frozen=True)
class ModelStates:
    model_class: str
    parameter_count: int
    trainable_count: int
    param_bytes: int
    buffer_bytes: int
    grad_bytes: int
    largest_param_bytes: int
    shapes: tuple[ParamShape, ...]  # each trainable parameter
    vocab_size: int | None
    depth: int | None
    # Frozen weights (LoRA's base, a quantized base's tensors) rounded to CUDA's allocator blocks.
    frozen_slack_cuda: int = 0

    def weight_bytes(self, target: Target) -> int:
        """Parameters and buffers, each its own allocation."""
        frozen = self.frozen_slack_cuda if target == Target.CUDA else 0
        return self.param_bytes + self.buffer_bytes + self.rounding_slack(target) + frozen

    def gradient_bytes(self, target: Target) -> int:
        return self.grad_bytes + self.rounding_slack(target)

    def rounding_slack(self, target: Target) -> int:
        return sum(allocation_bytes(s.nbytes, target) - s.nbytes for s in self.shapes)


def model_states(model: Any, config: Any) -> ModelStates:
    """Weights and gradients of ``model`` (storages counted once: tied embeddings share one)."""
    seen: set[int] = set()
    params: list[torch.Tensor] = []
    for p in model.parameters():
        key = p.untyped_storage()._cdata
        if key not in seen:
            seen.add(key)
            params.append(p)
    buffers = []
    for b in model.buffers():
        key = b.untyped_storage()._cdata
        if key not in seen:
            seen.add(key)
            buffers.append(b)
    trainable = [p for p in params if p.requires_grad]
    shapes = tuple(ParamShape(tuple(p.shape), p.element_size()) for p in trainable)
    return ModelStates(
        model_class=type(model).__name__,
        parameter_count=sum(p.numel() for p in params),
        trainable_count=sum(p.numel() for p in trainable),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        buffer_bytes=sum(b.numel() * b.element_size() for b in buffers),
        grad_bytes=sum(s.nbytes for s in shapes),
        largest_param_bytes=max((s.nbytes for s in shapes), default=0),
        shapes=shapes,
        vocab_size=getattr(config, "vocab_size", None),
        depth=num_layers(config),
    )


def optimizer_state_bytes(optimizer: str, shapes: tuple[ParamShape, ...], target: Target) -> int:
    """Bytes of every tensor the optimizer keeps, as the implementation allocates them:

    adamw: exp_avg + exp_avg_sq (parameter dtype) + a 0-dim fp32 ``step`` per parameter (torch.optim).
    sgd: one momentum buffer. adafactor (transformers, beta1=None): factored row/column second moments
    for tensors with >= 2 dims, a full second moment otherwise, and the 0-dim RMS tensor (step is a
    Python int). adafactor-torch (torch.optim.Adafactor): the same moments and a 0-dim fp32 step.
    adamw-8bit (bitsandbytes): two uint8 states + one fp32 absmax per 256 values, 32-bit states for
    tensors under 4096 values, and the two shared 256-entry quantization maps. paged-adamw-8bit: the
    same tensors, allocated in CUDA unified memory that the driver may page out to the host under
    pressure (planned as resident: what the step uses when the GPU has room).
    """

    def r(n: int) -> int:
        return allocation_bytes(n, target)

    total = 0
    for s in shapes:
        numel, size, shape = s.numel, s.element_size, s.shape
        if optimizer == "adamw":
            total += 2 * r(numel * size) + r(4)
        elif optimizer == "sgd":
            total += r(numel * size)
        elif optimizer in ("adafactor", "adafactor-torch"):
            if len(shape) >= 2:
                rows = math.prod(shape[:-1])
                cols = math.prod(shape[:-2]) * shape[-1]
                total += r(rows * size) + r(cols * size)
            else:
                total += r(numel * size)
            total += r(4)  # transformers: the 0-dim RMS tensor; torch: the 0-dim step
        elif optimizer in ("adamw-8bit", "paged-adamw-8bit"):
            if numel < BNB_MIN_8BIT_SIZE:
                total += 2 * r(numel * 4)
            else:
                blocks = -(-numel // BNB_BLOCK)
                total += 2 * r(numel) + 2 * r(blocks * 4)
        else:
            raise PlanError(f"unknown optimizer {optimizer!r} (one of {', '.join(OPTIMIZERS)})")
    if optimizer in ("adamw-8bit", "paged-adamw-8bit") and shapes:
        total += 2 * r(256 * 4)
    return total


def optimizer_step_temporary_bytes(
    optimizer: str, states: ModelStates, target: Target, impl: str | None = None
) -> int:
    """Transient bytes inside ``optimizer.step()`` beyond the states.

    AdamW depends on torch's implementation (``impl``; default: what torch.optim.AdamW picks — foreach
    on CUDA, the for-loop on CPU): foreach materialises sqrt(exp_avg_sq) for every parameter at once
    (4 bytes/param in fp32); the for-loop keeps sqrt and the division of one parameter alive together
    (2 x the largest); fused (the Trainer's adamw_torch_fused) needs ~0. Adafactor: the squared gradient
    and the update of the largest parameter (2 x largest). SGD with momentum and 8-bit AdamW update in
    place (0).
    """
    if optimizer == "adamw":
        impl = impl or ("foreach" if target == Target.CUDA else "for-loop")
        if impl == "foreach":
            return states.grad_bytes
        if impl == "fused":
            return 0
        return 2 * states.largest_param_bytes
    if optimizer in ("adafactor", "adafactor-torch"):
        return 2 * states.largest_param_bytes
    return 0
