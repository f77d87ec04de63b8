"""The live advisor: concrete, ranked suggestions from one snapshot of a training run. Stdlib only and
pure (no I/O, no clocks); the hook calls it each time it builds a snapshot, so it must stay well
under a millisecond.

Every suggestion says where its number comes from (``vocabulary.Source``): *measured* (read off this
run), *predicted* (this run's measurement times a stated model, or the plan's accounting for this
model) or *guide* (the training-anatomy guide's figure for BERT-large on a V100).

Memory techniques are suggested only under memory pressure — the run died of OOM, the allocator had
to retry or failed, or the step's peak is within PRESSURE of the device's memory — and the one that
fits where the peak is: a forward/backward peak dominated by activations → checkpointing and
gradient accumulation; a peak in the optimizer step → 8-bit AdamW or Adafactor. A healthy run (not
near its limit, mixed precision on a tensor-core GPU, aligned shapes, a flat allocated line, an
allocator cache close to the peak) gets no suggestion at all.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from anatomy import gpus, techniques
from anatomy.protocol import Hello, Snapshot, Suggestion
from anatomy.units import fmt_bytes
from anatomy.vocabulary import Component, OptimizerKind, Phase, Precision, Source

MIB = 1 << 20
GIB = 1 << 30
PRESSURE = 0.85  # peak + context over device memory at which memory techniques are worth their cost
CHECKPOINT_KEEPS = 0.10  # stated formula: per-layer checkpointing keeps ~10% of activations
WARMUP_STEPS = 3  # steps ignored by the leak rule (optimizer states appear on step 1, caches warm up)
LEAK_MIN_POINTS = 6
LEAK_MIN_BYTES = 8 * MIB
LEAK_MIN_FRACTION = 0.01
FRAGMENTATION_MIN_BYTES = 256 * MIB
FRAGMENTATION_FRACTION = 0.25

# Ranking: lower first; within a rank, the larger saving first.
_RANK = {
    "leak": 0,
    "fragmentation": 1,
    "gradient_checkpointing": 2,
    "gradient_accumulation": 2,
    "adamw_8bit": 2,
    "adafactor": 2,
    "tf32": 3,
    "mixed_precision": 3,
    "vocab_multiple": 4,
    "batch_multiple": 4,
}


def _mem(snapshot: Snapshot, component: Component) -> int | None:
    value = snapshot.memory.get(component)
    return value if isinstance(value, int) else None


def _peak(snapshot: Snapshot) -> int | None:
    if snapshot.cuda is not None and snapshot.cuda.peak_allocated:
        return snapshot.cuda.peak_allocated
    return snapshot.peak_bytes


def _precision(hello: Hello) -> Precision | None:
    try:
        return Precision(hello.precision)
    except ValueError:
        return None


def _optimizer(hello: Hello) -> OptimizerKind:
    try:
        return OptimizerKind(hello.optimizer)
    except ValueError:
        return OptimizerKind.OTHER


def _on_cuda(hello: Hello) -> bool:
    return hello.device.startswith("cuda")


def _batch_size(hello: Hello, snapshot: Snapshot) -> int | None:
    value = getattr(snapshot, "batch_size", None) or getattr(hello, "batch_size", None)
    return value if isinstance(value, int) and value > 0 else None


def _pressure(hello: Hello, snapshot: Snapshot) -> tuple[bool, str]:
    """Whether memory is tight, and the sentence that says why."""
    if snapshot.oom:
        return True, "the run died of out-of-memory"
    cuda = snapshot.cuda
    if cuda is not None and cuda.ooms > 0:
        return True, f"the allocator failed {cuda.ooms} time(s)"
    if cuda is not None and cuda.alloc_retries > 0:
        return True, f"the allocator had to free its cache and retry {cuda.alloc_retries} time(s)"
    total = getattr(hello, "device_memory_bytes", None)
    peak = _peak(snapshot)
    if total and peak:
        used = max(peak, cuda.reserved if cuda is not None else 0) + (
            _mem(snapshot, Component.CUDA_CONTEXT) or 0
        )
        if used >= PRESSURE * total:
            return True, f"the step uses {fmt_bytes(used)} of {fmt_bytes(total)} ({used / total:.0%})"
    return False, ""


def _where(snapshot: Snapshot) -> str:
    phase = snapshot.peak_phase
    peak = _peak(snapshot)
    # Keyed by str: in process the tracker passes the phase's value, decode its member (which is its value).
    where: dict[str, str] = {
        Phase.FORWARD: "at the end of forward",
        Phase.BACKWARD: "during backward",
        Phase.OPTIMIZER: "in the optimizer step",
    }
    at = where.get(phase or "", "")
    return f"peak {fmt_bytes(peak)} {at}".rstrip() if peak else "peak unknown"


def _dominant(snapshot: Snapshot) -> tuple[Component | None, int]:
    parts = [
        (c, _mem(snapshot, c) or 0)
        for c in (Component.WEIGHTS, Component.OPTIMIZER_STATES, Component.GRADIENTS, Component.ACTIVATIONS)
    ]
    comp, value = max(parts, key=lambda cv: cv[1])
    return (comp, value) if value > 0 else (None, 0)


def _memory_rules(hello: Hello, snapshot: Snapshot, savings: Mapping[str, int], why: str) -> list[Suggestion]:
    out: list[Suggestion] = []
    acts = _mem(snapshot, Component.ACTIVATIONS) or 0
    states = _mem(snapshot, Component.OPTIMIZER_STATES) or 0
    peak = _peak(snapshot) or 0
    dominant, _ = _dominant(snapshot)
    where = _where(snapshot)
    share = (lambda v: f"{v / peak:.0%} of the peak") if peak else (lambda v: fmt_bytes(v))
    optimizer_peak = snapshot.peak_phase == Phase.OPTIMIZER or dominant is Component.OPTIMIZER_STATES
    activation_peak = snapshot.peak_phase in (Phase.FORWARD, Phase.BACKWARD) or (
        dominant is Component.ACTIVATIONS
    )
    if activation_peak and acts > 0:
        tech = techniques.TECHNIQUES[techniques.CHECKPOINTING]
        if techniques.CHECKPOINTING in savings:
            saving, source, how = (
                savings[techniques.CHECKPOINTING],
                Source.PREDICTED,
                "the plan for this model",
            )
        else:
            saving = int(acts * (1 - CHECKPOINT_KEEPS))
            source = Source.PREDICTED
            how = f"activations x {1 - CHECKPOINT_KEEPS:.1f} (layer inputs kept, the rest recomputed)"
        out.append(
            Suggestion(
                rule="gradient_checkpointing",
                title="Gradient checkpointing",
                detail=f"{why}; {where}; activations are {share(acts)}. Saving from {how}. "
                f"{tech.how}. Speed x{tech.speed_factor} ({tech.source_label}).",
                source=source.value,
                saving_bytes=saving,
                speed_factor=tech.speed_factor,
            )
        )
        batch = _batch_size(hello, snapshot)
        k = 4 if batch is None else max((d for d in (4, 3, 2) if d <= batch and batch % d == 0), default=1)
        if k > 1:
            tech = techniques.TECHNIQUES[techniques.GRAD_ACCUM]
            if techniques.GRAD_ACCUM in savings:
                saving, how = savings[techniques.GRAD_ACCUM], "the plan for this model"
            else:
                saving, how = int(acts * (1 - 1 / k)), f"activations x (1 - 1/{k})"
            split = f"batch {batch} -> {batch // k} x {k}" if batch else f"micro-batch / {k}, {k} steps"
            out.append(
                Suggestion(
                    rule="gradient_accumulation",
                    title=f"Gradient accumulation ({split})",
                    detail=f"{why}; {where}. Same effective batch in {k} micro-batches; saving from {how}. "
                    f"{tech.how}. Speed x{tech.speed_factor} ({tech.source_label}).",
                    source=Source.PREDICTED.value,
                    saving_bytes=saving,
                    speed_factor=tech.speed_factor,
                )
            )
    if optimizer_peak and states > 0 and _optimizer(hello) is OptimizerKind.ADAMW:
        tech = techniques.TECHNIQUES[techniques.ADAMW_8BIT]
        if techniques.ADAMW_8BIT in savings:
            saving, how = savings[techniques.ADAMW_8BIT], "the plan for this model"
        else:
            saving, how = states * 6 // 8, "measured optimizer states x 6/8 (8 -> 2 bytes/param)"
        out.append(
            Suggestion(
                rule="adamw_8bit",
                title="8-bit AdamW",
                detail=f"{why}; {where}; optimizer states are {share(states)}. "
                f"Saving from {how}. {tech.how}.",
                source=Source.PREDICTED.value,
                saving_bytes=saving,
            )
        )
        tech = techniques.TECHNIQUES[techniques.ADAFACTOR]
        if techniques.ADAFACTOR in savings:
            saving, source, how = savings[techniques.ADAFACTOR], Source.PREDICTED, "the plan for this model"
        else:
            saving, source = states // 2, Source.GUIDE
            how = "the guide's 8 -> ~4 bytes/param for Adafactor"
        out.append(
            Suggestion(
                rule="adafactor",
                title="Adafactor",
                detail=f"{why}; {where}. Saving from {how}; the guide warns of instability on some models. "
                f"{tech.how}.",
                source=source.value,
                saving_bytes=saving,
            )
        )
    return out


def _leak(snapshot: Snapshot, history: Sequence[Snapshot]) -> Suggestion | None:
    """Allocated memory between steps still growing after warm-up: something keeps each step alive."""
    by_step: dict[int, int] = {}
    for snap in (*history, snapshot):
        if snap.step <= WARMUP_STEPS or snap.pid != snapshot.pid:
            continue
        if snap.cuda is not None:
            value: int | None = snap.cuda.allocated
        else:
            value = _mem(snap, Component.UNATTRIBUTED)
        if value is not None:
            by_step[snap.step] = value
    if len(by_step) < LEAK_MIN_POINTS:
        return None
    steps = sorted(by_step)
    values = [by_step[s] for s in steps]
    growth = values[-1] - values[0]
    reference = max(values[0], _peak(snapshot) or 0)
    if growth < max(LEAK_MIN_BYTES, LEAK_MIN_FRACTION * reference):
        return None
    diffs = [b - a for a, b in itertools.pairwise(values)]
    rising = sum(d > 0 for d in diffs)
    if rising < 0.8 * len(diffs) or min(diffs) < -0.1 * growth:
        return None
    per_step = growth / (steps[-1] - steps[0])
    what = (
        "allocated CUDA memory" if snapshot.cuda is not None else "heap memory outside the tensors it knows"
    )
    return Suggestion(
        rule="leak",
        title=f"Memory grows {fmt_bytes(per_step)}/step: a leak?",
        detail=f"After warm-up the {what} grew by {fmt_bytes(growth)} over steps {steps[0]}-{steps[-1]} "
        "and is still growing. Typical cause: keeping tensors that hold the graph, e.g. "
        "`total_loss += loss` instead of `total_loss += loss.item()`, or appending outputs to a list.",
        source=Source.MEASURED.value,
        saving_bytes=growth,
    )


def _fragmentation(snapshot: Snapshot) -> Suggestion | None:
    cuda = snapshot.cuda
    if cuda is None or cuda.reserved <= 0:
        return None
    idle = cuda.reserved - max(cuda.peak_allocated, cuda.allocated)
    big = idle >= FRAGMENTATION_MIN_BYTES and idle >= FRAGMENTATION_FRACTION * cuda.reserved
    if not big and cuda.alloc_retries == 0:
        return None
    retries = f"; the allocator retried {cuda.alloc_retries} time(s)" if cuda.alloc_retries else ""
    return Suggestion(
        rule="fragmentation",
        title="Fragmentation: the allocator caches more than the step uses",
        detail=f"Reserved {fmt_bytes(cuda.reserved)} but the step never used more than "
        f"{fmt_bytes(max(cuda.peak_allocated, cuda.allocated))}{retries}. "
        "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before starting the run.",
        source=Source.MEASURED.value,
        saving_bytes=max(idle, 0),
    )


def _speed_rules(hello: Hello, snapshot: Snapshot) -> list[Suggestion]:
    out: list[Suggestion] = []
    if not _on_cuda(hello):
        return out
    name = getattr(hello, "device_name", None)
    gen = gpus.generation(name)
    precision = _precision(hello)
    if gen is None or precision is None:
        return out
    if precision is Precision.FP32:
        if gen in gpus.TF32_GENERATIONS and getattr(hello, "tf32", None) is not True:
            tech = techniques.TECHNIQUES[techniques.TF32]
            out.append(
                Suggestion(
                    rule="tf32",
                    title="fp32 matmuls without TF32 tensor cores",
                    detail=f"{name} has TF32 tensor cores and this run multiplies in full fp32. "
                    f"{tech.how} (the guide: up to 3x throughput, same convergence for most training).",
                    source=Source.GUIDE.value,
                )
            )
        tech = techniques.TECHNIQUES[techniques.MIXED_PRECISION]
        dtype = "bf16" if gen in gpus.TF32_GENERATIONS else "fp16"
        out.append(
            Suggestion(
                rule="mixed_precision",
                title=f"Mixed precision ({dtype}): x{tech.speed_factor} samples/s in the guide",
                detail=f"{name} has {dtype} tensor cores. {tech.how}. "
                f"Speed from the guide ({tech.source_label}: 8.86 -> 18.64 samples/s with fp16).",
                source=Source.GUIDE.value,
                speed_factor=tech.speed_factor,
            )
        )
        return out
    multiple = gpus.tensor_core_multiple(name)
    vocab = getattr(hello, "vocab_size", None)
    if isinstance(vocab, int) and vocab > 0 and vocab % multiple:
        padded = -(-vocab // multiple) * multiple
        out.append(
            Suggestion(
                rule="vocab_multiple",
                title=f"Vocabulary {vocab} is not a multiple of {multiple}",
                detail=f"The embedding and output matmuls use tensor cores best with dimensions that are "
                f"multiples of {multiple} on {name} (the guide). Pad to {padded}: "
                f"model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of={multiple}).",
                source=Source.GUIDE.value,
            )
        )
    batch = _batch_size(hello, snapshot)
    if batch is not None and batch % multiple and batch > multiple // 2:
        out.append(
            Suggestion(
                rule="batch_multiple",
                title=f"Batch size {batch} is not a multiple of {multiple}",
                detail=f"Tensor cores on {name} prefer batch sizes that are multiples of {multiple} "
                f"(the guide); try {(batch // multiple) * multiple or multiple} or "
                f"{-(-batch // multiple) * multiple}.",
                source=Source.GUIDE.value,
            )
        )
    return out


def advise(
    hello: Hello,
    snapshot: Snapshot,
    history: Sequence[Snapshot] = (),
    savings: Mapping[str, int] | None = None,
) -> list[Suggestion]:
    """Ranked suggestions for this snapshot (empty for a healthy run). ``savings``: technique key
    (``anatomy.techniques``) -> bytes of peak the plan computed that technique would save."""
    out: list[Suggestion] = []
    leak = _leak(snapshot, history)
    if leak is not None:
        out.append(leak)
    frag = _fragmentation(snapshot)
    if frag is not None:
        out.append(frag)
    tight, why = _pressure(hello, snapshot)
    if tight:
        out.extend(_memory_rules(hello, snapshot, savings or {}, why))
    out.extend(_speed_rules(hello, snapshot))
    out.sort(key=lambda s: (_RANK.get(s.rule, 9), -(s.saving_bytes or 0)))
    return out
