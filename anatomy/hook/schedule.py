"""When each measurement runs. Every step is cheap; the costly parts run on some steps only:

- weights, gradients and optimizer states are re-summed on the first ``WARMUP_REFRESH_STEPS`` steps
  and then once every ``sample_every`` steps (and when the tracker sees the model or optimizer change);
- saved tensors are counted on the first steps, whenever the input shape changes, and otherwise about
  once per publish interval (packing costs a few microseconds per saved tensor);
- on CPU the heap is read at the phase boundaries (``mallinfo2`` walks the arenas: ~0.1 ms a read) on
  the first steps, sampled steps, after a shape change and about once per publish interval;
- the op-group profiler runs on sampled steps (the second step, then one in ``sample_every``), the
  per-op memory trace on the first sampled step, after a shape change and on one sampled step in
  ``TRACE_EVERY``.

"About once per publish interval" is counted in steps of the run's median duration, so time spent
outside steps (evaluation, checkpointing) does not make the per-interval work more frequent.

All of that optional work also answers to a time budget (:class:`Budget`): the hook measures what each kind of
work costs it (saved-tensor counting, heap reads, the model-signature walk, re-sums, sampled steps) and runs
the periodic kinds only while the total stays within ``BUDGET_FRACTION`` of the time the training steps took
(start to end: waits outside steps give it no room), a third of it kept for the cheap kinds
(``RESERVED_SHARE``: a costly sampled step does not hold the re-sums back); a periodic re-sum or sampled step
that does not fit waits for the first later step that does. A model whose count costs more is counted less
often; what must run (a shape change, a change the hooks saw) runs regardless and is charged too; the first
steps' work (``WARMUP_REFRESH_STEPS``: their re-sums, counts and heap reads, step 1's sampled work) is a fixed
cost per run, not charged — it only teaches the budget what each kind costs. A figure not re-measured on a
step stands with the step it was measured on (``at_peak_step``, ``op_groups_step``, ``activations_step``,
``sums_step``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

SAMPLE_EVERY = 100  # the op-group profiler runs on one step in this many (after the second step)
TRACE_EVERY = 5  # the per-op memory trace runs on one sampled step in this many
WARMUP_REFRESH_STEPS = 3  # weights/gradients/optimizer states re-summed on every one of the first steps
# Of the training thread's wall time, for everything beyond the per-step marks: three quarters of the 1% the
# whole hook may cost, the rest left to the marks, the publisher's thread and the garbage they make (with 1%
# here, every step that rests added to it and no run could come out within 1.01x). Sampled steps may spend
# two thirds of it (0.5%), the cheap kinds keep the last third (0.25%, as when the budget was 1%).
BUDGET_FRACTION = 0.0075
RECENT_STEPS = 9  # unprofiled steps whose median duration sets the schedule's pace

# The kinds of optional work the budget knows the cost of.
COUNT = "count"
HEAP = "heap"
LOOK = "look"
REFRESH = "refresh"
SAMPLED = "sampled"


# Of the budget, the share kept for the cheap kinds (re-sums, heap reads, saved-tensor counts, looks): a
# sampled step never spends it, so one costly profiling episode cannot hold the re-sums back for hundreds
# of steps (an 81 ms episode held 0.45 ms re-sums past a 32-update run's end); the cheap kinds may also use
# whatever of the rest sampled steps leave.
RESERVED_SHARE = 1 / 3


class Budget:
    """Time the hook spent on optional work, against ``fraction`` of the time ``clock`` says training
    took (the schedule's: the time its steps took, start to end). ``charge`` after doing the work (what
    it measured), ``allows`` before: the work runs only if its last measured cost fits in what is left.

    Two accounts share that allowance: sampled steps (the profiler and the trace) may spend all of it but
    the cheap kinds' reserve (``reserved`` of it, less what they spent), the cheap kinds their reserve or
    all that sampled steps leave. Together they never spend more than the allowance."""

    def __init__(
        self,
        fraction: float = BUDGET_FRACTION,
        clock: Callable[[], float] = time.perf_counter,
        reserved: float = RESERVED_SHARE,
    ) -> None:
        self.fraction = float(fraction)
        self.reserved = min(max(float(reserved), 0.0), 1.0)
        self._clock = clock
        self.started = clock()
        self.spent_s = 0.0  # by every kind
        self.sampled_s = 0.0  # of that, by sampled steps
        self.cost: dict[str, float] = {}  # the last measured cost of each kind

    def charge(self, kind: str, seconds: float) -> None:
        if seconds > 0:
            self.spent_s += seconds
            if kind == SAMPLED:
                self.sampled_s += seconds
            self.cost[kind] = seconds

    def note(self, kind: str, seconds: float) -> None:
        """What ``kind`` costs, learnt from work that is not charged (the first steps')."""
        if seconds > 0:
            self.cost[kind] = seconds

    def allowance_s(self) -> float:
        return self.fraction * (self._clock() - self.started)

    def _needed_s(self, kind: str) -> float:
        """The allowance at which ``kind``'s last measured cost fits."""
        cost = self.cost.get(kind, 0.0)
        sampled = self.sampled_s
        cheap = self.spent_s - sampled
        if kind == SAMPLED:  # all of it but the cheap kinds' unspent reserve
            rest = 1.0 - self.reserved
            return max(self.spent_s + cost, (sampled + cost) / rest if rest > 0 else float("inf"))
        need = cheap + cost  # their reserve, or what sampled steps leave
        return min(need / self.reserved if self.reserved > 0 else float("inf"), need + sampled)

    def wait_s(self, kind: str) -> float:
        """Seconds of training until ``allows(kind)``, if nothing else is charged meanwhile."""
        if self.fraction <= 0:
            return float("inf")
        return max(self._needed_s(kind) / self.fraction - (self._clock() - self.started), 0.0)

    def allows(self, kind: str) -> bool:
        return self._needed_s(kind) <= self.fraction * (self._clock() - self.started)


class Periodic:
    """Work due one step in ``every`` that answers to the budget: one that does not fit is owed, and runs on
    the first later step the budget has room for; asked again within a step, the same answer."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.owed = False
        self._index = -1
        self._answer = False

    def due(self, index: int, every: int, budget: Budget) -> bool:
        if index == self._index:
            return self._answer
        due = self.owed or (every > 0 and index % every == 0)
        if due and not budget.allows(self.kind):
            self.owed, due = True, False
        elif due:
            self.owed = False
        self._index, self._answer = index, due
        return due


class Schedule:
    """Decides, per step, which measurements are due; remembers when each last ran."""

    def __init__(self, sample_every: int, interval_s: float, budget: Budget | None = None) -> None:
        self.sample_every = int(sample_every)
        # The time training steps took, start to end (the tracker adds each finished step's): the budget's
        # clock, so that waits outside steps (evaluation, checkpoints, a loader) give the hook no room.
        self.trained_s = 0.0
        self.budget = budget if budget is not None else Budget(clock=lambda: self.trained_s)
        self.interval_s = float(interval_s)
        # The last unprofiled steps' durations, a ring written in place (``note_step_s``, or the tracker's
        # inline copy of it on an ordinary step: no object per step); the median is taken when asked.
        self.recent_step_s: list[float] = [0.0] * RECENT_STEPS
        self.noted = 0  # durations noted so far (the ring's next slot: ``noted % RECENT_STEPS``)
        self.input_shape: tuple[int, ...] | None = None  # of the last counted forward
        self.counted_step = -1  # the last step whose saved tensors were counted
        self.heap_step: int | None = None  # the last step that read the heap
        self.retrace = False  # the shapes changed since the last trace
        self._sampled = Periodic(SAMPLED)
        self._refresh = Periodic(REFRESH)

    def charge(self, kind: str, seconds: float, index: int) -> None:
        """Step ``index``'s optional work of ``kind`` cost ``seconds``: charged to the budget, except on
        the first steps (a fixed cost per run, whatever the budget: it only teaches what each kind
        costs)."""
        if index < WARMUP_REFRESH_STEPS:
            self.budget.note(kind, seconds)
        else:
            self.budget.charge(kind, seconds)

    def refresh_due(self, index: int) -> bool:
        """Re-sum weights, gradients and optimizer states on this step? The first steps always; then one
        in ``sample_every`` when the budget has room for what the last re-sum cost, else the first later
        step that has (the sums stand meanwhile)."""
        if index < WARMUP_REFRESH_STEPS:
            return True
        return self._refresh.due(index, self.sample_every, self.budget)

    def note_step_s(self, step_s: float) -> None:
        """An unprofiled step's duration (the median of the last few sets the pace of the schedule)."""
        self.recent_step_s[self.noted % RECENT_STEPS] = step_s
        self.noted += 1

    @property
    def median_step_s(self) -> float:
        """The median duration of the last unprofiled steps (0 before any)."""
        n = min(self.noted, RECENT_STEPS)
        if n == 0:
            return 0.0
        ordered = sorted(self.recent_step_s[:n])
        mid = n // 2
        return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    def steps_per_interval(self) -> int:
        median = self.median_step_s
        return max(1, int(self.interval_s / median)) if median > 0 else 1

    def quiet_until(self, index: int, looked_at: int) -> int:
        """The first step from ``index`` on at which a heap read, a saved-tensor count, a look at the
        parameters, a re-sum or a sampled step can fall due by the step count: the steps before it are
        ordinary, and the tracker takes that from one compare as each begins. (A new input shape and a
        change the hooks saw are looked for on every step all the same.)"""
        if index < WARMUP_REFRESH_STEPS or self.heap_step is None:
            return index
        per = self.steps_per_interval()
        due = min(
            self._affordable(index, self.heap_step + per, HEAP),
            self._affordable(index, self.counted_step + per, COUNT),
            self._affordable(index, looked_at + per, LOOK),
        )
        every = self.sample_every
        if every > 0:
            due = min(due, -(-index // every) * every)  # the next re-sum and sampled step
            if self._sampled.owed:  # a sampled step waiting for the budget
                due = min(due, self._affordable(index, index, SAMPLED))
            if self._refresh.owed:  # a re-sum waiting for the budget
                due = min(due, self._affordable(index, index, REFRESH))
        return due

    def _affordable(self, index: int, due: int, kind: str) -> int:
        """``due``, or where that has passed and the budget holds the work back, the step by which the
        budget will have room for it at the current pace (then the usual checks decide)."""
        step_s = self.median_step_s
        if due > index or step_s <= 0:
            return due
        wait = self.budget.wait_s(kind)
        return index + int(min(wait / step_s, 1e6)) if wait > 0 else index

    def heap_due(self, index: int) -> bool:
        """Read the heap at this step's boundaries (CPU)? In steady state each step's readings repeat
        the last ones; a shape change found at the forward turns reading on there."""
        if self.heap_step is None or index < WARMUP_REFRESH_STEPS:
            return True
        if self.sample_due(index) or self.refresh_due(index):
            return True
        return index - self.heap_step >= self.steps_per_interval() and self.budget.allows(HEAP)

    def look_due(self, index: int, looked_at: int) -> bool:
        """Walk the model's parameters for changes no hook sees (``p.data = ...``, ``requires_grad_``)?
        Once per publish interval at most, and only within the budget."""
        return index - looked_at >= self.steps_per_interval() and self.budget.allows(LOOK)

    def sample_due(self, index: int) -> bool:
        """Never the first (warm-up) step; then the second one, so short runs see op groups too; then one
        in ``sample_every`` — when the budget has room for what the last sampled step cost, else on the
        first later step that has (the op groups stand meanwhile, with the step they were sampled on)."""
        if self.sample_every <= 0 or index == 0:
            return False
        if index == 1:
            return True
        return self._sampled.due(index, self.sample_every, self.budget)

    def trace_due(self, index: int, have_trace: bool) -> bool:
        """The per-op trace costs about as much as the op-group profiler; the peak it finds changes
        only with the shapes."""
        if not have_trace or self.retrace:
            return True
        return index % (self.sample_every * TRACE_EVERY) == 0

    def count_due(self, index: int, shape: tuple[int, ...] | None, already: bool) -> bool:
        """Count saved tensors on this forward? ``already``: this step counts anyway (a trace, or an
        earlier micro-batch). A new shape also makes the next sampled step trace again."""
        first_steps = index < WARMUP_REFRESH_STEPS
        if already or first_steps or shape != self.input_shape:
            due = True
        else:
            due = index - self.counted_step >= self.steps_per_interval() and self.budget.allows(COUNT)
        if due:
            if shape != self.input_shape and not first_steps:
                self.retrace = True
            self.input_shape = shape
        return due
