"""A finished step's figures, from values: a step record's memory result, then its snapshot.

Pure functions: they take what the tracker measured (the step record, the sums, the memory backend's
peak split) and what it knows (as :class:`StepFacts` and :class:`SnapshotFacts`) and return new values;
nothing here reads a clock, a tensor, a backend or the tracker. The tracker decides *when* a step is
assembled in full; an ordinary step's snapshot is the last one repeated with the new step's number,
time and timing (made from its row in :mod:`anatomy.step_feed`), where :func:`stamp` says every other
figure would come out the same.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, replace
from typing import Any

from anatomy.hook.distributed import communication_bytes
from anatomy.hook.guard import MAX_TEXT, Feature
from anatomy.hook.record import MemoryResult, PeakSplit, StepParts, StepRecord, Sums
from anatomy.hook.split import divide_preexisting, split_peak
from anatomy.protocol import CudaMemory, OpGroupStat, Snapshot, Timing
from anatomy.vocabulary import Component, MemorySource, OpGroup

_NO_MEMORY: dict[Component, int | None] = dict.fromkeys(Component)  # copied per result
_NAMED = (Feature.OPTIMIZER_STATES, Feature.GRADIENTS, Feature.ACTIVATIONS)


@dataclass(frozen=True, slots=True)
class StepFacts:
    """What a step's memory result needs besides its record, the sums and the backend's peak split: the
    tracker's state as the step ended."""

    off: Set[Feature]  # the features that stopped measuring (their figures are None)
    has_optimizer: bool
    counted_step: int  # the last step whose saved tensors were counted (-1: none yet)
    has_others: bool  # models named besides the trained one
    managed: int  # paged optimizer states in CUDA managed memory
    default_samples: int | None  # samples per step given at track(), for the batch size
    runtime: int | None = None  # the runtime baseline (CPU), once measured
    source: MemorySource = MemorySource.NONE  # what the peak was read from


def batch_size(rec: StepRecord, default_samples: int | None) -> int | None:
    """Samples per micro-batch: given per step (or at track()), else counted from the inputs."""
    if rec.micro <= 0:
        return None
    samples = rec.samples if rec.samples is not None else default_samples
    if samples is None:
        samples = rec.samples_seen or None
    return max(int(samples // rec.micro), 1) if samples else None


def stamp(rec: StepRecord, sums: Sums, batch: int | None) -> tuple[Any, ...]:
    """What a step's memory figures depend on besides the sums and the backend's state (which change
    only on steps that measure): equal stamps, equal figures."""
    return (
        rec.micro,
        batch,
        rec.grads_begin,
        rec.opt_begin,
        rec.grads if rec.grads is not None else sums.gradients,
        rec.opt_after if rec.opt_after is not None else sums.optimizer_states,
        # whose heap readings (CPU); on CUDA every step reads the allocator, and its readings are the
        # next two figures and the peak that StepSnapshots._repeat compares: not the step's number, or no
        # CUDA step would ever repeat the last snapshot (each built anew: measured +0.9 ms a step on a GPU)
        rec.heap_from if rec.heap_from is not None else (None if rec.cuda_start is not None else rec.index),
        rec.cuda_start,
        rec.cuda_end,  # the allocator statistics read (CUDA; once per publish interval)
    )


def memory_result(
    rec: StepRecord, parts: StepParts, sums: Sums, split: PeakSplit | None, facts: StepFacts
) -> MemoryResult:
    """Component bytes of the finished step, its peak, where the peak was and the split at it.
    ``parts``: the step's named tensors (:func:`anatomy.hook.split.step_parts`); ``split``: the memory
    backend's peak of the step (None: no backend, or nothing read)."""
    off = facts.off
    batch = batch_size(rec, facts.default_samples)
    memory = dict(_NO_MEMORY)
    memory[Component.WEIGHTS] = sums.weights + parts.weight_copies
    if Feature.OPTIMIZER_STATES in off:
        memory[Component.OPTIMIZER_STATES] = None
    else:
        memory[Component.OPTIMIZER_STATES] = parts.optimizer_states if facts.has_optimizer else 0
    memory[Component.GRADIENTS] = parts.gradients if Feature.GRADIENTS not in off else None
    counted = None  # counted less often than every step: the figure says which step it is from
    if Feature.ACTIVATIONS not in off and parts.activations_known:
        counted = rec.index if rec.activations is not None else facts.counted_step
        counted = counted if counted >= 0 else None
        memory[Component.ACTIVATIONS] = parts.activations
        memory[Component.INPUTS] = parts.inputs or None  # a row only where there are some
        unsharded = rec.unsharded if rec.activations is not None else sums.unsharded
        memory[Component.UNSHARDED_PARAMETERS] = unsharded  # a row only under FSDP
    buckets = sums.buckets
    comm = communication_bytes(buckets, rec.grads_begin)
    if buckets is not None and comm is not None and (comm or not buckets.are_gradients):
        memory[Component.COMMUNICATION_BUFFERS] = comm  # a row only under DDP, when not the gradients
    others = facts.has_others
    if others:
        memory[Component.OTHER_MODELS] = sums.other_models
    if split is None:
        return MemoryResult(
            step=rec.index,
            memory=memory,
            micro=rec.micro,
            batch=batch,
            activations_step=counted,
            sums_step=sums.step if sums.step >= 0 else None,
        )
    memory[Component.TEMPORARIES] = split.temporaries
    runtime = facts.runtime
    other_models = sums.other_models if others else 0
    pre = divide_preexisting(split.preexisting or 0, parts.inputs, runtime, comm or 0, other_models)
    memory[Component.UNATTRIBUTED] = pre.unattributed if split.preexisting is not None else None
    if runtime is not None:
        memory[Component.RUNTIME] = runtime
    if split.allocator_cache is not None:
        memory[Component.ALLOCATOR_CACHE] = split.allocator_cache
    at_peak, excess = split_peak(
        split.peak, sums.weights, split.held, pre, runtime=runtime is not None, others=others
    )
    unsharded = memory.get(Component.UNSHARDED_PARAMETERS)
    if unsharded is not None:
        # The gathered parameters FSDP keeps through backward (those still held after the forward) are
        # in the peak's remainder: named, out of temporaries.
        held = min(unsharded, at_peak.get(Component.TEMPORARIES) or 0)
        at_peak[Component.UNSHARDED_PARAMETERS] = held
        at_peak[Component.TEMPORARIES] = (at_peak.get(Component.TEMPORARIES) or 0) - held
    cuda: CudaMemory | None = split.cuda
    if cuda is not None and facts.managed:
        cuda = replace(cuda, managed=facts.managed)
    named = not any(f in off for f in _NAMED)
    return MemoryResult(
        step=rec.index,
        memory=memory,
        peak=split.peak,
        phase=split.phase,
        source=facts.source,
        cuda=cuda,
        micro=rec.micro,
        batch=batch,
        at_peak=at_peak if named else None,
        at_peak_step=split.at_peak_step if named else None,
        activations_step=counted,
        sums_step=sums.step if sums.step >= 0 else None,
        excess=excess,
    )


def unmeasured(step: int, weights: int | None) -> MemoryResult:
    """The memory result where no step finished (an OOM record before the first): the weights, if
    known."""
    memory = dict(_NO_MEMORY)
    memory[Component.WEIGHTS] = weights
    return MemoryResult(step=step, memory=memory)


@dataclass(frozen=True, slots=True)
class SnapshotFacts:
    """Everything of a snapshot besides the step's memory result."""

    pid: int
    seq: int
    time: float
    expected_bytes_per_param: dict[Component, float | None]
    parameter_count: int
    trainable_parameter_count: int | None
    timing: Timing
    op_groups: dict[OpGroup, OpGroupStat] | None
    op_groups_step: int | None
    achieved_tflops: float | None
    mfu: float | None
    grad_accum_steps: int  # the tracker's setting, for a step that saw no micro-batch
    error: str | None


def snapshot(result: MemoryResult, facts: SnapshotFacts, oom: str | None = None) -> Snapshot:
    """The snapshot of one step, without suggestions (the advisor reads it first). ``oom``: the
    out-of-memory error's text, for the OOM record."""
    return Snapshot(
        pid=facts.pid,
        seq=facts.seq,
        time=facts.time,
        step=result.step,
        memory=dict(result.memory),
        expected_bytes_per_param=facts.expected_bytes_per_param,
        parameter_count=facts.parameter_count,
        trainable_parameter_count=facts.trainable_parameter_count,
        peak_bytes=result.peak,
        peak_phase=result.phase,
        memory_source=result.source,
        cuda=result.cuda,
        timing=facts.timing,
        op_groups=dict(facts.op_groups) if facts.op_groups is not None else None,
        op_groups_step=facts.op_groups_step,
        achieved_tflops=facts.achieved_tflops,
        mfu=facts.mfu,
        grad_accum_steps=max(result.micro, 1) if result.micro else facts.grad_accum_steps,
        error=facts.error,
        oom=oom[:MAX_TEXT] if oom is not None else None,
        batch_size=result.batch,
        at_peak=result.at_peak,
        at_peak_step=result.at_peak_step,
        activations_step=result.activations_step,
        sums_step=result.sums_step,
    )


@dataclass(frozen=True, slots=True)
class Assembled:
    """A step built in full: its snapshot (without suggestions), its :func:`stamp`, and the bytes the named
    tensors exceeded its peak by (0: they fit)."""

    snapshot: Snapshot
    stamp: tuple[Any, ...]
    excess: int


def assemble(
    rec: StepRecord,
    parts: StepParts,
    sums: Sums,
    split: PeakSplit | None,
    facts: StepFacts,
    snapshot_facts: SnapshotFacts,
    oom: str | None = None,
) -> Assembled:
    """A finished step from its values to its snapshot: :func:`memory_result`, then :func:`snapshot`."""
    result = memory_result(rec, parts, sums, split, facts)
    return Assembled(snapshot(result, snapshot_facts, oom), stamp(rec, sums, result.batch), result.excess)
