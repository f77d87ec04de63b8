"""The one vocabulary of anatomy-top: memory components, operation groups, phases, precisions,
optimizer kinds, and the bytes per parameter the training-anatomy guide predicts for them.

Stdlib only: the monitor imports this module and must never pull in torch.
"""

from __future__ import annotations

from enum import Enum


class Component(str, Enum):
    """Where a training process's GPU (or host) memory goes.

    The first two exist only on CUDA (NVML's per-process figure minus what the caching allocator
    reserved, and reserved minus allocated); the other six are the guide's components.
    """

    CUDA_CONTEXT = "cuda_context"
    ALLOCATOR_CACHE = "allocator_cache"
    WEIGHTS = "weights"
    OPTIMIZER_STATES = "optimizer_states"
    GRADIENTS = "gradients"
    ACTIVATIONS = "activations"
    TEMPORARIES = "temporaries"
    UNATTRIBUTED = "unattributed"

    @property
    def label(self) -> str:
        return COMPONENT_LABELS[self]


COMPONENT_LABELS: dict[Component, str] = {
    Component.CUDA_CONTEXT: "CUDA context + kernels",
    Component.ALLOCATOR_CACHE: "Allocator cache",
    Component.WEIGHTS: "Weights",
    Component.OPTIMIZER_STATES: "Optimizer states",
    Component.GRADIENTS: "Gradients",
    Component.ACTIVATIONS: "Activations",
    Component.TEMPORARIES: "Temporaries",
    Component.UNATTRIBUTED: "Unattributed",
}

# The components a tensor-level measurement can attribute (the guide's six, with
# "functionality-specific" folded into UNATTRIBUTED because nothing can tell them apart).
MODEL_COMPONENTS: tuple[Component, ...] = (
    Component.WEIGHTS,
    Component.OPTIMIZER_STATES,
    Component.GRADIENTS,
    Component.ACTIVATIONS,
    Component.TEMPORARIES,
    Component.UNATTRIBUTED,
)


class OpGroup(str, Enum):
    """The guide's three operation groups, plus the optimizer step and everything else."""

    CONTRACTION = "tensor_contractions"
    NORMALIZATION = "statistical_normalizations"
    ELEMENTWISE = "element_wise"
    OPTIMIZER = "optimizer"
    OTHER = "other"

    @property
    def label(self) -> str:
        return OP_GROUP_LABELS[self]


OP_GROUP_LABELS: dict[OpGroup, str] = {
    OpGroup.CONTRACTION: "Tensor contractions",
    OpGroup.NORMALIZATION: "Statistical normalizations",
    OpGroup.ELEMENTWISE: "Element-wise",
    OpGroup.OPTIMIZER: "Optimizer",
    OpGroup.OTHER: "Other",
}


class Phase(str, Enum):
    """Phases of one training step; the peak of a step is attributed to one of them."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"


class Precision(str, Enum):
    FP32 = "fp32"
    FP16_MIXED = "fp16_mixed"
    BF16_MIXED = "bf16_mixed"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def is_mixed(self) -> bool:
        return self in (Precision.FP16_MIXED, Precision.BF16_MIXED)


class OptimizerKind(str, Enum):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw_8bit"
    SGD_MOMENTUM = "sgd_momentum"
    SGD = "sgd"
    ADAFACTOR = "adafactor"
    NONE = "none"
    OTHER = "other"


class Source(str, Enum):
    """Where a number comes from: every figure shown to a user says which."""

    MEASURED = "measured"
    PREDICTED = "predicted"
    GUIDE = "guide"


# Bytes per parameter from the training-anatomy guide ("Anatomy of Model's Memory").
_WEIGHT_BYTES: dict[Precision, float] = {
    Precision.FP32: 4.0,
    Precision.FP16_MIXED: 6.0,
    Precision.BF16_MIXED: 6.0,
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
}
_OPTIMIZER_BYTES: dict[OptimizerKind, float] = {
    OptimizerKind.ADAMW: 8.0,
    OptimizerKind.ADAMW_8BIT: 2.0,
    OptimizerKind.SGD_MOMENTUM: 4.0,
    OptimizerKind.SGD: 0.0,
    # The guide: "slightly more than 4 bytes" for Adafactor; 4 is its floor.
    OptimizerKind.ADAFACTOR: 4.0,
    OptimizerKind.NONE: 0.0,
}
# The guide: gradients are kept in fp32 for fp32 and mixed precision training alike.
_GRADIENT_BYTES: dict[Precision, float] = {
    Precision.FP32: 4.0,
    Precision.FP16_MIXED: 4.0,
    Precision.BF16_MIXED: 4.0,
    Precision.FP16: 2.0,
    Precision.BF16: 2.0,
}


def expected_bytes_per_param(
    component: Component, precision: Precision, optimizer: OptimizerKind
) -> float | None:
    """The guide's bytes/param for a component, or None where the guide gives no per-param figure
    (activations, temporaries and the rest depend on batch, sequence and hidden sizes)."""
    if component is Component.WEIGHTS:
        return _WEIGHT_BYTES.get(precision)
    if component is Component.OPTIMIZER_STATES:
        return _OPTIMIZER_BYTES.get(optimizer)
    if component is Component.GRADIENTS:
        return _GRADIENT_BYTES.get(precision)
    return None


def expected_model_state_bytes_per_param(precision: Precision, optimizer: OptimizerKind) -> float | None:
    """Weights + gradients + optimizer states per parameter (18 for mixed precision AdamW)."""
    parts = [
        expected_bytes_per_param(c, precision, optimizer)
        for c in (Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES)
    ]
    if any(p is None for p in parts):
        return None
    return float(sum(p for p in parts if p is not None))
