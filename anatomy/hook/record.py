"""The typed records the parts of the hook pass between them: one step's measurements, a memory reading
(with what the named tensors hold then), the last trace, and the memory figures of a finished step."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from anatomy.hook.held import Held
from anatomy.protocol import CudaMemory
from anatomy.vocabulary import Component, Phase
from anatomy.vocabulary import MemorySource as MemorySource

if TYPE_CHECKING:
    from anatomy.hook.cuda import CudaStats
    from anatomy.hook.distributed import Buckets
    from anatomy.hook.gradients import GradientWatcher
    from anatomy.hook.opgroups import OpGroupProfiler
    from anatomy.hook.pieces import Piece
    from anatomy.hook.timing import StepClock
    from anatomy.hook.trace import MemoryTrace


@dataclass(frozen=True, slots=True)
class Reading:
    """Memory in use at a phase boundary, with what the named tensors explain of its growth above the
    step's start (``explained``) and what they hold then (``held``)."""

    phase: Phase
    in_use: int
    explained: int
    held: Held


@dataclass(frozen=True, slots=True)
class Traced:
    """What the last per-op memory trace found; it stands for the steps until the next trace."""

    step: int
    growth: int  # the highest reading above the step's start
    phase: Phase
    temporaries: int  # the largest excess over the named tensors of any phase
    held: Held  # what the named tensors held at the highest reading


@dataclass(frozen=True, slots=True)
class PhasePeak:
    """A phase's peak on CUDA: exact when the process-wide peak rose during the phase (the maximum was
    reached in it), else the higher of its boundary readings (a lower bound)."""

    phase: Phase
    value: int
    exact: bool


@dataclass(frozen=True, slots=True)
class KnownGrowth:
    """The last step peak measured exactly (a rising step, or a per-op trace): its growth above the
    step's start, which steps with the same shapes repeat."""

    step: int
    growth: int
    phase: Phase


@dataclass(frozen=True, slots=True)
class HeapHistory:
    """The boundary readings of the last step that read the heap (CPU), for the steps that do not."""

    step: int
    start: int
    readings: list[Reading]


@dataclass(slots=True)
class StepRecord:
    """What one step has measured so far."""

    index: int
    auto: bool  # begun by a training-mode forward (no explicit step boundaries)
    samples: int | None
    tokens: int | None
    clock: StepClock
    micro: int = 0  # forwards (micro-batches) seen
    samples_seen: int = 0
    tokens_seen: int = 0
    activations: int | None = None  # the largest micro-batch's saved bytes, when counted this step
    weight_copies: int = 0
    inputs: int = 0  # pre-existing storages saved for backward (the largest micro-batch's)
    # FSDP's all-gathered (unsharded) parameters still held when the forward ended; None: none seen
    unsharded: int | None = None
    window: bool = False  # this micro-batch's saved tensors are being counted
    grads_begin: int = 0
    opt_begin: int = 0
    grads: int | None = None  # gradients once complete (before the optimizer)
    opt_after: int | None = None  # optimizer states after the optimizer step
    # CPU heap
    heap_start: int | None = None
    heap_on: bool = True  # read the heap at this step's boundaries; else the last readings stand
    heap_from: int | None = None  # the step whose heap readings this one reports
    readings: list[Reading] = field(default_factory=list)
    # CUDA allocator: boundary readings, and the process-wide peak seen so far
    cuda_start: int | None = None
    cuda_phase: Phase = Phase.OTHER
    cuda_phase_start: int = 0  # allocated when the current phase began
    cuda_high: int = 0  # the process-wide peak at the last reading
    cuda_peaks: list[PhasePeak] = field(default_factory=list)
    cuda_end: CudaStats | None = None
    # sampled steps
    profiler: OpGroupProfiler | None = None
    trace: MemoryTrace | None = None
    grad_watch: GradientWatcher | None = None
    piece: Piece | None = None  # the instrument runs over this piece of the step (None: the whole step)
    profiled: bool = False
    began_s: float = 0.0  # a sampled step's start (perf_counter), for the budget
    started: float = 0.0  # the step's start (perf_counter): its time goes to the budget's clock
    version: int = -1  # the probe parameter's version counter at the start (-1: none)
    # hook state
    in_forward: int = 0
    counting: bool = False
    optimizer_ran: bool = False  # an optimizer phase began (gradients were complete)
    in_optimizer: bool = False  # between an optimizer's step pre-hook (or closure's end) and its post-hook
    updated: bool = False  # an optimizer's step post-hook fired: the optimizer really updated
    suspended: bool = False  # a step block ended without an update: the next block continues this step
    recall: bool = False  # a closure called again inside one optimizer step (LBFGS): no new micro-batch
    closure: bool = False  # the step's forward began in an optimizer's closure (after the optimizer began)
    blocks: int = 1  # step blocks (tracker.step / begin_step) merged into this step
    refresh: bool = False  # the schedule's re-sum of this step, decided once as it begins
    quiet: bool = False  # nothing is due on this step by the step count (Schedule.quiet_until)
    # An ordinary step on the host clock that has done nothing but mark its phases: it ends in O(1) (its
    # row to the step feed, no snapshot). Any measurement, or anything unusual, clears it for the step.
    plain: bool = False


@dataclass(frozen=True, slots=True)
class StepParts:
    """Bytes of the named tensors of a finished step (the last counts where this step did not count)."""

    activations: int
    weight_copies: int
    gradients: int
    optimizer_states: int
    new_gradients: int  # gradients made in this step
    new_states: int  # optimizer states made in this step
    at_start: int  # weights + optimizer states + gradients at the step's start
    activations_known: bool
    inputs: int = 0  # pre-existing storages saved for backward


@dataclass(frozen=True, slots=True)
class MemoryResult:
    """The memory figures of one finished step, ready for a snapshot."""

    step: int
    memory: dict[Component, int | None]
    peak: int | None = None
    phase: Phase | None = None
    source: MemorySource = MemorySource.NONE
    cuda: CudaMemory | None = None
    micro: int = 0
    batch: int | None = None
    at_peak: dict[Component, int | None] | None = None
    at_peak_step: int | None = None
    activations_step: int | None = None  # the step whose saved tensors were counted
    sums_step: int | None = None  # the step whose re-sum gave weights, gradients, optimizer states
    excess: int = 0  # bytes the named tensors exceeded the peak by (taken off the split's other rows)


@dataclass(slots=True)
class Sums:
    """The last exact sums over the model's and optimizer's tensors, and the last activation count."""

    weights: int = 0
    weights_by_dtype: dict[str, int] = field(default_factory=dict)
    gradients: int = 0
    optimizer_states: int = 0
    activations: int | None = None  # None until a forward was counted
    weight_copies: int = 0
    inputs: int = 0
    unsharded: int | None = None
    buckets: Buckets | None = None  # DDP's, read on refresh steps
    other_models: int = 0  # the other models' weights (a teacher, a reference model), re-summed with ours
    step: int = -1  # the step of the last re-sum (-1: only at track())
    other_by_name: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Preexisting:
    """What was in use at the step's start besides weights, optimizer states and gradients, divided:
    inputs saved for backward, communication buffers, other models' weights, the runtime baseline (CPU),
    and what nothing explains."""

    inputs: int = 0
    runtime: int = 0
    unattributed: int = 0
    communication: int = 0
    other_models: int = 0


@dataclass(frozen=True, slots=True)
class PeakSplit:
    """A step's peak as a memory backend finds it, before it is split among the components."""

    peak: int
    phase: Phase
    temporaries: int
    preexisting: int | None  # in use at the step's start beyond weights, optimizer states, gradients
    held: Held  # what the named tensors held at the peak
    at_peak_step: int  # the step whose split (trace or boundary readings) this is
    allocator_cache: int | None = None
    cuda: CudaMemory | None = None
