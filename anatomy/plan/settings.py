"""What a plan is asked for, and the checks that need nothing but the request itself.

Stdlib only: `anatomy-top plan` validates its arguments here before torch and transformers are
imported, so a typo is reported in milliseconds rather than after a fake training step.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum

from anatomy import gpus
from anatomy.vocabulary import OptimizerKind, Precision


class PlanError(Exception):
    """A plan that cannot be made (bad input, unsupported model or setting): its text is for users,
    one line, saying what to change."""


class Task(str, Enum):
    """The head a plan trains, and so which inputs a micro-batch holds."""

    CAUSAL_LM = "causal-lm"
    MASKED_LM = "masked-lm"
    SEQUENCE_CLASSIFICATION = "sequence-classification"
    SEQ2SEQ_LM = "seq2seq-lm"
    IMAGE_CLASSIFICATION = "image-classification"
    SPEECH_SEQ2SEQ = "speech-seq2seq"

    @property
    def takes_tokens(self) -> bool:
        return self not in (Task.IMAGE_CLASSIFICATION, Task.SPEECH_SEQ2SEQ)

    @property
    def help(self) -> str:
        return TASK_HELP[self]


TASK_HELP: dict[Task, str] = {
    Task.CAUSAL_LM: "decoder-only language models (Llama, Mistral, GPT-2, Qwen2, Phi, ...): "
    "token ids, labels = the ids; --seq-len",
    Task.MASKED_LM: "BERT-style masked language modelling: token ids and token labels; --seq-len",
    Task.SEQUENCE_CLASSIFICATION: "a classification head on any text model: token ids, one label per "
    "sequence; --seq-len",
    Task.SEQ2SEQ_LM: "encoder-decoder models (T5, BART, mT5, Pegasus, Marian, ...): --seq-len source "
    "tokens, --target-len label tokens",
    Task.IMAGE_CLASSIFICATION: "vision models (ViT, ConvNeXt, Swin, ResNet, ...): images of "
    "--image-size pixels, one label per image",
    Task.SPEECH_SEQ2SEQ: "speech encoder-decoder models (Whisper, Speech2Text, ...): log-mel features of "
    "--audio-seconds of audio (default: the model's window, 30 s for Whisper), --target-len label tokens",
}


class Target(str, Enum):
    """Whose kernels' memory the plan models."""

    CUDA = "cuda"
    CPU = "cpu"


OPTIMIZERS: tuple[str, ...] = (
    "adamw",
    "adamw-8bit",
    "paged-adamw-8bit",
    "sgd",
    "adafactor",
    "adafactor-torch",
)
OPTIMIZER_KINDS: dict[str, OptimizerKind] = {
    "adamw": OptimizerKind.ADAMW,
    "adamw-8bit": OptimizerKind.ADAMW_8BIT,
    "paged-adamw-8bit": OptimizerKind.ADAMW_8BIT,  # the same states, in pageable (unified) memory
    "sgd": OptimizerKind.SGD_MOMENTUM,
    "adafactor": OptimizerKind.ADAFACTOR,
    "adafactor-torch": OptimizerKind.ADAFACTOR,
}
OPTIMIZER_IMPLS: tuple[str, ...] = ("foreach", "fused", "for-loop")
PLANNED_PRECISIONS = (Precision.FP32, Precision.FP16_MIXED, Precision.BF16_MIXED)
DEFAULT_SEQ_LEN = 512

# What a plan can model. Beyond these, some tensor of the step (logits: tokens x vocabulary; unfused
# attention: batch x heads x seq^2) no longer has a byte count torch can hold in an int64, and the
# fake run would end in an overflow deep inside torch. Real micro-batches are orders of magnitude
# smaller (a 7B model at 4096 tokens fits about 16 sequences on an 80 GB GPU).
MAX_TOKENS = 1 << 31  # batch x sequence length of one micro-batch
MAX_SEQ_LEN = 1 << 22  # tokens in one sequence
MAX_PIXELS = 1 << 34  # batch x image height x width
MAX_IMAGE_SIZE = 1 << 15
MAX_GRAD_ACCUM = 1 << 20
MIN_GPU_BYTES = 1 << 20  # --gpu 0GiB, or a size typed in the wrong unit


@dataclass(frozen=True)
class PlanSettings:
    """One training configuration to plan. ``None`` means "as the model and task imply" (resolved into
    a :class:`~anatomy.plan.workload.Workload` for each model)."""

    batch_size: int = 4  # per micro-batch (per_device_train_batch_size)
    seq_len: int | None = None  # tokens per sequence (seq2seq: source); None: 512
    precision: Precision = Precision.FP32
    optimizer: str = "adamw"
    gradient_checkpointing: bool = False
    grad_accum: int = 1
    task: Task | None = None  # None: from config.architectures
    target: Target = Target.CUDA
    keep_outputs: bool = True  # the loop holds `out = model(...)` until the next forward (a plain loop)
    exact_depth: bool = False
    fused_attention: bool = True  # CUDA target: SDPA runs a fused kernel (False: the math path, probs saved)
    optimizer_impl: str | None = None  # AdamW: foreach | fused | for-loop (None: torch's default)
    padded: bool | None = None  # an attention mask with padding; None: yes when the model takes one
    use_cache: bool | None = None  # the forward returns a KV cache; None: the config's use_cache
    target_len: int | None = None  # seq2seq: label tokens; None: = seq_len
    image_size: int | None = None  # image tasks: pixels per side; None: config.image_size
    # Parameter-efficient fine-tuning (anatomy.plan.peft_model, anatomy.plan.quant)
    lora_rank: int | None = None  # LoRA adapters of this rank (None: full fine-tuning)
    lora_targets: tuple[str, ...] | None = None  # None: PEFT's defaults for the architecture
    lora_dropout: float = 0.0  # PEFT's LoraConfig default
    quant: str | None = None  # a bitsandbytes-quantized frozen base: nf4 | fp4 | int8
    # Speech (Task.SPEECH_SEQ2SEQ)
    audio_seconds: float | None = None  # None: the model's window (Whisper: 30 s)
    # One rank of a data-parallel job (anatomy.plan.sharding): a plan per world size given.
    fsdp: tuple[int, ...] = ()  # FSDP2 world sizes
    ddp: tuple[int, ...] = ()  # DDP world sizes
    zero: int | None = None  # DeepSpeed ZeRO stage (1, 2, 3), on each of world_size
    world_size: tuple[int, ...] = ()  # ZeRO's world sizes

    def __post_init__(self) -> None:
        # Accept the strings the CLI and JSON use; hold the enums.
        if isinstance(self.task, str) and not isinstance(self.task, Task):
            object.__setattr__(self, "task", _enum(Task, self.task, "task"))
        if isinstance(self.target, str) and not isinstance(self.target, Target):
            object.__setattr__(self, "target", _enum(Target, self.target, "target"))

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.value if isinstance(value, Enum) else value
        return out


def _enum(kind: type[Enum], value: str, what: str) -> Enum:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in kind)
        raise PlanError(f"unknown {what} {value!r} (one of {choices})") from None


def _count(n: int) -> str:
    return f"{n:,}"


def check_settings(settings: PlanSettings) -> None:
    """Every check that needs no model: raises PlanError with one line naming the bad value."""
    s = settings
    counts: tuple[tuple[str, int | None], ...] = (
        ("batch size", s.batch_size),
        ("gradient accumulation", s.grad_accum),
        ("sequence length", s.seq_len),
        ("target length", s.target_len),
        ("image size", s.image_size),
    )
    for name, value in counts:
        optional = name not in ("batch size", "gradient accumulation")
        if value is None and optional:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlanError(f"{name} must be a whole number >= 1 (got {value!r})")
    if s.grad_accum > MAX_GRAD_ACCUM:
        raise PlanError(f"gradient accumulation {_count(s.grad_accum)} is beyond {_count(MAX_GRAD_ACCUM)}")
    if s.task is None or s.task.takes_tokens:
        check_shape(s.batch_size, s.seq_len or DEFAULT_SEQ_LEN, s.target_len, None)
    else:
        check_shape(s.batch_size, None, None, s.image_size)
    if s.optimizer not in OPTIMIZERS:
        raise PlanError(f"unknown optimizer {s.optimizer!r} (one of {', '.join(OPTIMIZERS)})")
    if s.optimizer_impl is not None and s.optimizer_impl not in OPTIMIZER_IMPLS:
        raise PlanError(
            f"unknown optimizer implementation {s.optimizer_impl!r} (one of {', '.join(OPTIMIZER_IMPLS)})"
        )
    if s.precision not in PLANNED_PRECISIONS:
        raise PlanError(f"precision {s.precision.value} is not planned (fp32, fp16 or bf16 mixed)")
    if not isinstance(s.target, Target):
        raise PlanError(f"unknown target {s.target!r} (one of cuda, cpu)")
    if s.task is not None and not isinstance(s.task, Task):
        raise PlanError(f"unknown task {s.task!r} (one of {', '.join(t.value for t in Task)})")
    if s.task is not None:
        check_task_options(s, s.task)
    check_adapters(s)
    check_parallelism(s)


QUANT_TYPES: tuple[str, ...] = ("nf4", "fp4", "int8")


def check_adapters(s: PlanSettings) -> None:
    """LoRA and quantization settings (before torch loads)."""
    rank = s.lora_rank
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
        raise PlanError(f"LoRA rank must be a whole number >= 1 (got {rank!r})")
    if not 0.0 <= s.lora_dropout < 1.0:
        raise PlanError(f"LoRA dropout must be in [0, 1) (got {s.lora_dropout!r})")
    if rank is None and (s.lora_targets is not None or s.lora_dropout):
        raise PlanError("--lora-targets and --lora-dropout need --lora R (or --qlora)")
    if s.lora_targets is not None and (not s.lora_targets or not all(s.lora_targets)):
        raise PlanError("--lora-targets needs module names, e.g. q_proj,v_proj")
    if s.quant is not None and s.quant not in QUANT_TYPES:
        raise PlanError(f"unknown quantization {s.quant!r} (one of {', '.join(QUANT_TYPES)})")
    if s.audio_seconds is not None and not 0 < s.audio_seconds <= 3600:
        raise PlanError(f"--audio-seconds must be in (0, 3600] (got {s.audio_seconds!r})")


MAX_WORLD_SIZE = 1 << 20
ZERO_STAGES = (1, 2, 3)


def check_parallelism(s: PlanSettings) -> None:
    """--fsdp/--ddp/--world-size: whole numbers >= 1; --zero: a stage DeepSpeed has, with a world size."""
    for name, sizes in (("--fsdp", s.fsdp), ("--ddp", s.ddp), ("--world-size", s.world_size)):
        for n in sizes:
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_WORLD_SIZE:
                raise PlanError(
                    f"{name} {n!r}: a world size is a whole number from 1 to {_count(MAX_WORLD_SIZE)}"
                )
    if s.zero is not None and s.zero not in ZERO_STAGES:
        raise PlanError(f"--zero {s.zero!r}: DeepSpeed's ZeRO stages are 1, 2 and 3")
    if s.zero is None and s.world_size:
        raise PlanError("--world-size applies to --zero (for FSDP and DDP: --fsdp N, --ddp N)")
    if s.zero is not None and not s.world_size:
        raise PlanError("--zero needs --world-size N (the ranks the states are partitioned over)")


def check_shape(batch: int, seq_len: int | None, target_len: int | None, image_size: int | None) -> None:
    """One micro-batch must stay within what a plan can model (see MAX_TOKENS)."""
    if batch > MAX_TOKENS:
        raise PlanError(f"batch size {_count(batch)} is more than a plan can model ({_count(MAX_TOKENS)})")
    for name, value in (("sequence length", seq_len), ("target length", target_len)):
        if value is None:
            continue
        if value > MAX_SEQ_LEN:
            raise PlanError(f"{name} {_count(value)} is more than a plan can model ({_count(MAX_SEQ_LEN)})")
        if batch * value > MAX_TOKENS:
            raise PlanError(
                f"batch size {_count(batch)} x {name} {_count(value)} = {_count(batch * value)} tokens per "
                f"micro-batch is more than a plan can model ({_count(MAX_TOKENS)})"
            )
    if image_size is not None:
        if image_size > MAX_IMAGE_SIZE:
            raise PlanError(f"image size {_count(image_size)} is beyond {_count(MAX_IMAGE_SIZE)} pixels")
        if batch * image_size**2 > MAX_PIXELS:
            raise PlanError(
                f"batch size {_count(batch)} x {image_size}x{image_size} images is more than a plan can "
                f"model ({_count(MAX_PIXELS)} pixels per micro-batch)"
            )


def check_task_options(settings: PlanSettings, task: Task) -> None:
    """Options that belong to other tasks are errors, not silently ignored."""
    s = settings
    if s.target_len is not None and task not in (Task.SEQ2SEQ_LM, Task.SPEECH_SEQ2SEQ):
        raise PlanError(f"--target-len applies to seq2seq-lm and speech-seq2seq, not {task.value}")
    if s.audio_seconds is not None and task is not Task.SPEECH_SEQ2SEQ:
        raise PlanError(f"--audio-seconds applies to speech-seq2seq, not {task.value}")
    if task is Task.SPEECH_SEQ2SEQ and s.seq_len is not None:
        raise PlanError("--seq-len does not apply to speech-seq2seq (use --audio-seconds and --target-len)")
    if s.image_size is not None and task is not Task.IMAGE_CLASSIFICATION:
        raise PlanError(f"--image-size applies to image-classification, not {task.value} (use --seq-len)")
    if task is Task.IMAGE_CLASSIFICATION:
        if s.seq_len is not None:
            raise PlanError("--seq-len does not apply to image-classification (use --image-size)")
        if s.padded:
            raise PlanError("--padding applies to token inputs, not image-classification")


def check_gpu(gpu: str | None, gpu_bytes: int | None, target: Target) -> None:
    """A GPU to fit against must be known and have memory, and only the CUDA target is fitted."""
    if gpu is not None:
        total = gpus.gpu_memory_bytes(gpu)
        if total is None:
            raise PlanError(f"unknown GPU {gpu!r}: one of {', '.join(gpus.names())}, or a size like 24GiB")
        if total < MIN_GPU_BYTES:
            raise PlanError(f"GPU memory {gpu!r} is {total} bytes: a GPU has at least 1 MiB")
    if gpu_bytes is not None and gpu_bytes < MIN_GPU_BYTES:
        raise PlanError(f"GPU memory of {gpu_bytes} bytes: a GPU has at least 1 MiB")
    if target is Target.CPU and (gpu is not None or gpu_bytes is not None):
        raise PlanError(
            "--gpu does not apply to --target cpu (a CPU plan is not fitted to GPU memory): drop one of them"
        )
