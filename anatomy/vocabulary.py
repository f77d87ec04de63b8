"""The one vocabulary of anatomy-top: memory components, operation groups, phases, precisions,
optimizer kinds, how memory was measured, a publisher's state, a process's place in the tree, and the
bytes per parameter the training-anatomy guide predicts for them.

Stdlib only: the monitor imports this module and must never pull in torch.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A word of the vocabulary. A member is its string: it compares, hashes, looks up, serialises to
    JSON and (unlike a plain ``str, Enum`` on Python 3.11+) prints and formats as its value, so a member
    passes wherever its string did and every text shown or written stays the same."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class Component(Word):
    """Where a training process's GPU (or host) memory goes.

    The first two exist only on CUDA (NVML's per-process figure minus what the caching allocator
    reserved, and reserved minus allocated); RUNTIME is their CPU counterpart (the process's heap
    before its first step: interpreter, torch, libraries). WEIGHTS … UNATTRIBUTED are the guide's
    components; UNSHARDED_PARAMETERS, OTHER_MODELS, INPUTS and COMMUNICATION_BUFFERS appear only where
    a job has them (FSDP's all-gathered parameters, a teacher or reference model run in the step,
    pre-existing tensors saved for backward, DDP/FSDP communication buffers). The order of the members
    is the order in which every view lists them.
    """

    CUDA_CONTEXT = "cuda_context"
    ALLOCATOR_CACHE = "allocator_cache"
    RUNTIME = "runtime"
    WEIGHTS = "weights"
    UNSHARDED_PARAMETERS = "unsharded_parameters"
    OTHER_MODELS = "other_models"
    OPTIMIZER_STATES = "optimizer_states"
    GRADIENTS = "gradients"
    ACTIVATIONS = "activations"
    INPUTS = "inputs"
    COMMUNICATION_BUFFERS = "communication_buffers"
    TEMPORARIES = "temporaries"
    UNATTRIBUTED = "unattributed"

    @property
    def label(self) -> str:
        return COMPONENT_LABELS[self]


COMPONENT_LABELS: dict[Component, str] = {
    Component.CUDA_CONTEXT: "CUDA context + kernels",
    Component.ALLOCATOR_CACHE: "Allocator cache",
    Component.RUNTIME: "Runtime (before step 1)",
    Component.WEIGHTS: "Weights",
    Component.UNSHARDED_PARAMETERS: "Unsharded parameters",
    Component.OTHER_MODELS: "Other models",
    Component.OPTIMIZER_STATES: "Optimizer states",
    Component.GRADIENTS: "Gradients",
    Component.ACTIVATIONS: "Activations",
    Component.INPUTS: "Inputs",
    Component.COMMUNICATION_BUFFERS: "Communication buffers",
    Component.TEMPORARIES: "Temporaries",
    Component.UNATTRIBUTED: "Unattributed",
}

# One sentence per component: what the figure is and where it comes from (help screen, selection,
# README). Every view explains a component with these words and no others.
COMPONENT_HELP: dict[Component, str] = {
    Component.CUDA_CONTEXT: (
        "NVML's figure for the process minus what PyTorch's caching allocator reserved: the CUDA context, "
        "loaded kernels and libraries (cuBLAS/cuDNN workspaces), typically 0.3-1.5 GiB per process."
    ),
    Component.ALLOCATOR_CACHE: (
        "Memory the caching allocator reserved from the driver but did not hand to tensors at the step's "
        "peak (reserved - peak allocated): free for PyTorch, not for other processes."
    ),
    Component.RUNTIME: (
        "CPU only: the process's heap in use before its first step (interpreter, torch, libraries, the "
        "data pipeline), measured once; the CPU counterpart of the CUDA context."
    ),
    Component.WEIGHTS: (
        "Parameters and buffers (tied storages once; under autocast also the low-precision weight copies); "
        "on a sharded job this rank's shards."
    ),
    Component.UNSHARDED_PARAMETERS: (
        "FSDP: the all-gathered full parameters that exist while a sharded module runs forward or backward."
    ),
    Component.OTHER_MODELS: (
        "Parameters and buffers of the other models the step runs (a distillation teacher, a DPO reference "
        "model, an EMA copy), storages shared with the trained model not counted twice."
    ),
    Component.OPTIMIZER_STATES: (
        "Every tensor the optimizer keeps in its state (AdamW: two fp32 moments, 8 B/param)."
    ),
    Component.GRADIENTS: (
        "Parameter gradients at their peak (DDP's gradient buckets count here, not twice); on a sharded "
        "job this rank's reduced shards."
    ),
    Component.ACTIVATIONS: (
        "Tensors saved for backward during the step's forward (the loss included), storage-deduplicated, "
        "parameters and inputs excluded."
    ),
    Component.INPUTS: (
        "Tensors that existed before the step and were saved for backward: the batch, or the whole storage "
        "a batch is a view of (a dataset tensor sliced into batches)."
    ),
    Component.COMMUNICATION_BUFFERS: (
        "Buffers of the collective communication (DDP buckets not already counted as gradients, FSDP's "
        "all-gather/reduce-scatter staging)."
    ),
    Component.TEMPORARIES: (
        "What the step's peak holds beyond the named components: intermediate results, workspace, "
        "autograd bookkeeping."
    ),
    Component.UNATTRIBUTED: (
        "In use at the step's start and explained by nothing above (on CPU: heap grown since the runtime "
        "baseline by anything but the model)."
    ),
}

# Shown only when a snapshot carries a figure for them: a job without FSDP has no unsharded
# parameters, and a row of "unmeasured" for it would be noise.
OPTIONAL_COMPONENTS: frozenset[Component] = frozenset(
    {
        Component.RUNTIME,
        Component.UNSHARDED_PARAMETERS,
        Component.OTHER_MODELS,
        Component.INPUTS,
        Component.COMMUNICATION_BUFFERS,
    }
)

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


class OpGroup(Word):
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


class Phase(Word):
    """Phases of one training step; the peak of a step is attributed to one of them."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    OTHER = "other"


class Precision(Word):
    FP32 = "fp32"
    FP16_MIXED = "fp16_mixed"
    BF16_MIXED = "bf16_mixed"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def is_mixed(self) -> bool:
        return self in (Precision.FP16_MIXED, Precision.BF16_MIXED)


class OptimizerKind(Word):
    ADAMW = "adamw"
    ADAMW_8BIT = "adamw_8bit"
    SGD_MOMENTUM = "sgd_momentum"
    SGD = "sgd"
    ADAFACTOR = "adafactor"
    NONE = "none"
    OTHER = "other"


class Source(Word):
    """Where a number comes from: every figure shown to a user says which."""

    MEASURED = "measured"
    PREDICTED = "predicted"
    GUIDE = "guide"


class MemorySource(Word):
    """How a snapshot's temporaries and peak were measured (the wire's ``memory_source``)."""

    TENSORS = "tensors"  # the named tensors alone: no allocator or heap figure
    CUDA_ALLOCATOR = "cuda_allocator"
    GLIBC = "glibc"
    NONE = "none"


class PublisherState(Word):
    """Where the monitor stands with one publishing training process. A hook at its limit of readers
    says so (a ``busy`` message) and is shown as ERROR with that reason until a retry gets in."""

    LIVE = "live"
    OOM = "oom"  # its process died of out-of-memory: the last snapshot comes from the OOM file
    EXITED = "exited"  # it closed its socket: its last figures stay on screen a while
    ERROR = "error"  # it could not be read (connect refused, protocol error, a stranger's socket, busy)


class TreeRole(Word):
    """A process's place in the process tree around the GPU processes."""

    GPU = "gpu"  # NVML lists it
    ANCESTOR = "ancestor"  # a parent of one
    CHILD = "child"  # a child of one


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
    component: Component,
    precision: Precision,
    optimizer: OptimizerKind,
    trainable_fraction: float = 1.0,
    quantized: bool = False,
) -> float | None:
    """The guide's bytes/param for a component, or None where the guide gives no per-param figure
    (activations, temporaries and the rest depend on batch, sequence and hidden sizes).

    Weights are per parameter of the whole model; gradients and optimizer states per *trainable*
    parameter (``trainable_fraction`` of them: a LoRA adapter's few). Mixed precision's 6 B/param is the
    fp32 weight plus the half-precision copy autocast keeps of a trained weight; a frozen weight keeps no
    such copy, so only the trainable fraction adds its 2 bytes. Quantized weights (4-bit, 8-bit) have no
    guide figure."""
    if component is Component.WEIGHTS:
        if quantized:
            return None
        full = _WEIGHT_BYTES.get(precision)
        if full is None or not precision.is_mixed:
            return full
        master = _WEIGHT_BYTES[Precision.FP32]
        return master + (full - master) * min(max(trainable_fraction, 0.0), 1.0)
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
