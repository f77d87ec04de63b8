"""An ordinary step in progress, held as a few slots rather than a :class:`~anatomy.hook.record.StepRecord`.

On an ordinary step (nothing due by the schedule, no change seen) the usual step is one forward, one
optimizer step and nothing else: begin, forward start and end, optimizer start and end, end. The tracker's
hooks follow that sequence on a :class:`LeanStep` — a stage number and five clock readings: no record reset,
no mark tuple — because after a big step the hook's code runs cold in the CPU caches and every line of it
costs (a 2-block MLP, measured in one process: the hook's functions took 48 µs a step before, 28 µs after;
hooks that do nothing cost ~20 µs there, torch's hook dispatch included).

Anything else — a second forward, a new batch shape, a closure, a framework's callback (but the Trainer's
optimizer begin and end, which the usual step already marks), a backward end, an exception, a step block
without an update (but a resting step's under accumulation, as the look's: ``BETWEEN``) — makes the step a
record (:meth:`LeanStep.record`: exactly the record the general path would hold at that point) and the general
path goes on from there.

On CUDA the step's times are the device's: on a step the device times (one every tenth of the publish
interval, at most 50 ms: :data:`~anatomy.hook.ordinary.DEVICE_EVERY_S`; ``clock`` None on the others, whose
rows carry the newest device times) each stage also records a CUDA event on the step's ``clock`` (one of
:class:`~anatomy.hook.timing.ClockRing`'s, its events made once), which goes to the throughput's queue
with every other step's and is read once the device has caught up; and the allocator is read once, at the
step's end (:meth:`~anatomy.hook.backend.CudaBackend.lean_steady`), where the full way reads it at every phase
boundary. A lean CUDA step that becomes a record reads it there and goes on from the last reading step's
start (:meth:`~anatomy.hook.backend.CudaBackend.lean_promoted`); its record keeps the step's clock and goes
the full way (never ``plain``).
"""

from __future__ import annotations

from anatomy.hook.record import StepRecord
from anatomy.hook.timing import (
    BACKWARD_END,
    BEGIN,
    END,
    FORWARD_POST,
    FORWARD_PRE,
    OPTIMIZER_POST,
    OPTIMIZER_PRE,
    StepClock,
)
from anatomy.vocabulary import Phase

# How far the usual step has come.
BEGUN, IN_FORWARD, FORWARD_DONE, IN_OPTIMIZER, UPDATED = range(5)
# A resting step between two of its blocks (gradient accumulation: a block ended without an update, as the
# look's did): only the next block's begin goes on from here; any other call makes it the record the
# general path holds between blocks (suspended).
BETWEEN = -1
# The phase a step is in at each stage (BEGUN: none yet).
PHASE_AT = (Phase.OTHER, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.OTHER)
# What the next ordinary step may do (RestGate.ok): never rest, or rest (REST: begin at FORWARD_DONE,
# every hook of ours off) where it is given what the batch would otherwise tell (NEED_SAMPLES,
# NEED_TOKENS).
REST_NEVER, REST, NEED_SAMPLES, NEED_TOKENS = 0, 1, 2, 4


class DeviceTimed:
    """A lean step timed on the device, as the throughput's queue holds it until its events can be read:
    what the step's rates need (``samples``, ``tokens``: as the step resolved them)."""

    __slots__ = ("index", "profiled", "samples", "samples_seen", "tokens", "tokens_seen")

    def __init__(self, index: int, samples: int | None, tokens: int | None) -> None:
        self.index = index
        self.samples = samples
        self.tokens = tokens
        self.samples_seen = self.tokens_seen = 0
        self.profiled = False


class LeanStep:
    """One ordinary step's state (``active`` while it runs), and what the next one may take from the last
    full step: the batch shape counted last (``shape``) with what a batch of it adds to the samples and
    tokens seen."""

    __slots__ = (
        "active",
        "auto",
        "backward_ended",
        "blocks",
        "clock",
        "closure",
        "depth",
        "ended",
        "forward_post",
        "forward_pre",
        "framework",
        "grads_begin",
        "index",
        "micro",
        "opt_begin",
        "optimizer_post",
        "optimizer_pre",
        "resting",
        "samples",
        "samples_seen",
        "shape",
        "shape_samples",
        "shape_tokens",
        "stage",
        "started",
        "tokens",
        "tokens_seen",
        "version",
    )

    def __init__(self) -> None:
        self.active = False
        self.auto = False
        self.index = 0
        self.samples: int | None = None
        self.tokens: int | None = None
        self.stage = BEGUN
        self.started = self.forward_pre = self.forward_post = 0.0
        self.optimizer_pre = self.optimizer_post = self.ended = 0.0
        self.grads_begin = self.opt_begin = 0
        self.samples_seen = self.tokens_seen = 0
        self.shape: tuple[int, ...] | None = None
        self.shape_samples = 0  # a batch of ``shape``: its first dimension
        self.shape_tokens = 0  # its elements where it has two dimensions or more (tokens, if integers)
        # On CUDA: the step's events, recorded at each stage beside the host times (None: host-timed).
        self.clock: StepClock | None = None
        self.framework = False  # the forward was opened by a framework's call (forward_begin)
        self.depth = 0  # the model's own forwards open inside the framework's
        self.closure = False  # the optimizer's closure was wrapped (the framework's forward runs in it)
        self.backward_ended = 0.0  # a framework's backward end (0.0: none; the optimizer's start ends it)
        # Begun with every hook of ours off (FORWARD_DONE from the start, no forward times: NaN).
        self.resting = False
        # The probe parameter's version counter at the step's start (its update moves it: no optimizer hook
        # of ours runs on a resting step; a record made of the step may let the next ones rest).
        self.version = 0
        # A resting step's blocks begun, and the forwards of those before the one in progress (the look's
        # per block: its forwards run unseen).
        self.blocks = 1
        self.micro = 0

    def learn_shape(self, shape: tuple[int, ...] | None) -> None:
        """The batch shape an ordinary step's forward may have (the one counted last)."""
        self.shape = shape
        self.shape_samples = shape[0] if shape else 0
        tokens = 0
        if shape is not None and len(shape) >= 2:
            tokens = 1
            for n in shape:
                tokens *= n
        self.shape_tokens = tokens

    def record(
        self,
        spare: StepRecord | None,
        gradients: int,
        optimizer_states: int,
        on_device: bool = False,
        per_block: int = 1,
        updated: bool = False,
    ) -> StepRecord:
        """This step as the general path's record at the same point (``spare``: a record to reuse, one
        that ended plain and is referenced nowhere else). ``gradients`` and ``optimizer_states``: the
        tracker's sums, which change only on steps that measure — what this step read at the time.
        ``on_device``: the tracker's steps are timed on CUDA; one the device did not time (no ``clock``)
        goes the full way all the same (never ``plain``: the allocator read at each phase). A resting
        step's forwards ran unseen: ``per_block`` a block, as the look's. Between blocks (``BETWEEN``) it is
        suspended — ``updated`` too where its optimizer stepped after the block, outside any."""
        index, auto, samples, tokens = self.index, self.auto, self.samples, self.tokens
        device = self.clock
        if device is not None:  # timed on the device: the record takes the step's clock, its events marked,
            rec = StepRecord(index, auto, samples, tokens, device)  # and goes on the full way (not plain)
            rec.quiet = True
            rec.heap_on = False
        elif spare is not None and not on_device:
            rec = spare
            rec.index, rec.auto, rec.samples, rec.tokens = index, auto, samples, tokens
            rec.micro = rec.samples_seen = rec.tokens_seen = rec.in_forward = 0
            rec.grads = rec.opt_after = None
            rec.optimizer_ran = rec.in_optimizer = rec.updated = rec.suspended = False
            rec.recall = rec.counting = rec.window = rec.closure = False
            rec.blocks = 1
            rec.clock.marks.clear()
        else:
            rec = StepRecord(index, auto, samples, tokens, StepClock(False))
            rec.quiet = True
            rec.plain = not on_device
            rec.heap_on = False
        rec.opt_begin, rec.grads_begin, rec.started = self.opt_begin, self.grads_begin, self.started
        rec.version = self.version
        marks: list[tuple[str, object]] = [] if device is not None else rec.clock.marks
        marks.append((BEGIN, self.started))
        stage = self.stage
        watched = not self.resting  # (a resting step's forward ran unseen: as the step before it)
        if not watched:
            rec.blocks = self.blocks
            rec.micro = self.micro
        if stage == BETWEEN:
            rec.suspended = True
            # (its blocks' forwards ran unseen, on the samples and tokens they were told: what a watched
            # forward would have counted, should a later block not be told its own)
            rec.samples_seen, rec.tokens_seen = samples or 0, tokens or 0
            marks.append((BACKWARD_END, self.backward_ended))
            if updated:
                rec.optimizer_ran = rec.updated = True
                rec.grads, rec.opt_after = gradients, optimizer_states
            return rec
        if stage >= IN_FORWARD:
            rec.micro = 1 if watched else self.micro + per_block
            rec.samples_seen, rec.tokens_seen = self.samples_seen, self.tokens_seen
            if watched:
                marks.append((FORWARD_PRE, self.forward_pre))
            rec.in_forward = 1 + self.depth if stage == IN_FORWARD else 0
        rec.closure = False  # (a lean step's closure is wrapped in its forward, which began before it)
        if stage >= FORWARD_DONE:
            if watched:
                marks.append((FORWARD_POST, self.forward_post))
            if self.backward_ended:
                marks.append((BACKWARD_END, self.backward_ended))
        if stage >= IN_OPTIMIZER:
            rec.optimizer_ran = True
            rec.in_optimizer = stage == IN_OPTIMIZER
            rec.grads = gradients
            if self.optimizer_pre == self.optimizer_pre:  # (NaN: a resting step's update, not timed)
                marks.append((OPTIMIZER_PRE, self.optimizer_pre))
        if stage >= UPDATED:
            rec.updated = True
            rec.opt_after = optimizer_states
            if self.optimizer_post == self.optimizer_post:
                marks.append((OPTIMIZER_POST, self.optimizer_post))
        if not self.active:  # a finished step (one in progress has no end yet)
            marks.append((END, self.ended))
        return rec
