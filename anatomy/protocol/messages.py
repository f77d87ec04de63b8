"""The wire's messages: what a hook sends (a hello, snapshots, or "busy") as frozen dataclasses.
Stdlib only; their JSON form is the codec's business (:mod:`anatomy.protocol.codec`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from anatomy.vocabulary import Component, MemorySource, OpGroup, OptimizerKind, Phase, Precision, Source

PROTOCOL_VERSION = 3
READABLE_VERSIONS = frozenset({1, 2, 3})


@dataclass(frozen=True)
class LoraAdapter:
    """The LoRA adapter a PEFT model trains (its active one), for `anatomy-top plan --like`."""

    rank: int  # r
    target_modules: tuple[str, ...]  # the adapted modules' names (their last component: q_proj, ...)
    dropout: float = 0.0  # lora_dropout
    base_model_class: str = ""  # the wrapped transformers model's class (the hello's model_class is PEFT's)


@dataclass(frozen=True)
class Hello:
    pid: int
    host: str
    device: str  # "cpu", "cuda:0", ...
    precision: Precision | str  # a word decode does not know (a newer hook's) stays a string
    optimizer: OptimizerKind | str  # likewise
    model_class: str
    parameter_count: int
    torch_version: str
    started_at: float
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    dtype: str = "float32"  # the dtype of the parameters
    optimizer_class: str = ""
    # Optional, for the advisor (H6): tensor-core advice needs the GPU and the vocabulary size.
    device_name: str | None = None  # e.g. "NVIDIA A100-SXM4-80GB"; None on CPU / unknown
    device_memory_bytes: int | None = None  # total memory of the device
    vocab_size: int | None = None  # model.config.vocab_size when there is one
    tf32: bool | None = None  # torch.backends.cuda.matmul.allow_tf32 (or float32 matmul precision != highest)
    # The launcher's job identity (torchrun: TORCHELASTIC_RUN_ID): ranks of one job share it.
    run_id: str | None = None
    local_world_size: int | None = None
    # Version 3. Parameters that train (``requires_grad``): gradients and optimizer states are per these.
    # ``parameter_count`` is the logical total (a packed 4-bit weight counts its unpacked elements).
    trainable_parameter_count: int | None = None
    weight_quantization: str | None = None  # "nf4" | "fp4" | "int8" (bitsandbytes), None: not quantized
    other_models: dict[str, int] | None = None  # name -> bytes of each other model in the step
    # Optional, for `anatomy-top plan --like PID`: the model's Hugging Face config as JSON (its diff from
    # the defaults, at most MAX_CONFIG_CHARS) and the shape of the first batch tensor the model was fed.
    model_config: str | None = None
    batch_shape: tuple[int, ...] | None = None
    # Optional, for `plan --like` too: the shape of the first forward's ``labels`` (else its
    # ``decoder_input_ids``) when passed by keyword (an encoder-decoder's target length), and the LoRA
    # adapter when the model is a PEFT LoRA model.
    target_shape: tuple[int, ...] | None = None
    lora: LoraAdapter | None = None
    protocol: int = PROTOCOL_VERSION
    type: str = "hello"


@dataclass(frozen=True)
class CudaMemory:
    allocated: int
    reserved: int
    peak_allocated: int  # peak within the last step
    alloc_retries: int
    ooms: int
    # CUDA managed memory the hook can name (bitsandbytes' paged optimizer states), outside the allocator;
    # optional on the wire (an older hook sends none), so no protocol version change
    managed: int = 0


@dataclass(frozen=True)
class Timing:
    step_s: float | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None


@dataclass(frozen=True)
class OpGroupStat:
    flops: float | None  # per step
    time_s: float | None  # per step (device time on CUDA)


@dataclass(frozen=True)
class Suggestion:
    """One advisor line. ``saving_bytes`` is what the technique would save at the peak."""

    rule: str
    title: str
    detail: str
    source: Source | str  # likewise
    saving_bytes: int | None = None
    speed_factor: float | None = None


@dataclass(frozen=True)
class Snapshot:
    pid: int
    seq: int
    time: float
    step: int
    # Bytes per component; None means unmeasured on this platform (never 0 for unknown). The hook builds
    # and decode returns the maps keyed by the vocabulary's members, which encode as their strings.
    memory: dict[Component, int | None]
    # The bytes/param the guide expects for this set-up (None: no guide figure).
    expected_bytes_per_param: dict[Component, float | None]
    parameter_count: int
    peak_bytes: int | None = None
    peak_phase: Phase | None = None
    memory_source: MemorySource | str = MemorySource.TENSORS  # an unknown word stays a string
    cuda: CudaMemory | None = None
    timing: Timing = field(default_factory=Timing)
    op_groups: dict[OpGroup, OpGroupStat] | None = None  # from a sampled step
    op_groups_step: int | None = None  # which step the op groups were sampled on
    achieved_tflops: float | None = None
    mfu: float | None = None
    grad_accum_steps: int = 1
    suggestions: list[Suggestion] = field(default_factory=list)
    error: str | None = None  # the hook degraded: why
    oom: str | None = None  # set only in the last-snapshot file after an OOM
    batch_size: int | None = None  # samples per micro-batch (optional, for the advisor)
    # Optional (F1): Component -> bytes held AT THE MOMENT of the step's peak (weights, optimizer
    # states, gradients, activations, temporaries, unattributed); they sum to ``peak_bytes`` exactly.
    # ``memory`` keeps each component at its own maximum. None: an older hook, or no peak measured.
    at_peak: dict[Component, int | None] | None = None
    at_peak_step: int | None = None  # the step whose per-op trace gave the at-peak split
    trainable_parameter_count: int | None = None  # version 3: the divisor of gradients and optimizer states
    activations_step: int | None = None  # optional: the step whose saved tensors gave ``activations``
    # optional: the step whose re-sum gave weights, gradients and optimizer states (they stand in between)
    sums_step: int | None = None
    protocol: int = PROTOCOL_VERSION
    type: str = "snapshot"


@dataclass(frozen=True)
class Busy:
    """Sent instead of a hello by a hook that already serves its limit of readers, just before it closes
    the connection: the reader says "busy" (not "exited") and tries again soon."""

    readers: int
    limit: int
    protocol: int = PROTOCOL_VERSION
    type: str = "busy"


Message = Hello | Snapshot | Busy
