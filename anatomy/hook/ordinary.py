"""How a step begins, and how an ordinary one ends in O(1).

A step begins in :meth:`OrdinarySteps._begin`: the schedule's checks, the re-sums, the heap's first read
and a sampled step's instruments, where any is due — or, on an ordinary step (nothing due by the step
count, no change seen, timed on the host), nothing but a record (the one of the step before last, reset)
and a clock mark. Such a step stays ``plain`` while its hooks only mark its phases, and ends in
:meth:`OrdinarySteps._end_plain`: its numbers go to the step feed as one row of floats, no snapshot and
no object made; the snapshot (the last one built, with the step's number, time and timing) is made from
the row only where one is wanted (:mod:`anatomy.step_feed`).

A layer of :class:`~anatomy.hook.tracker.Tracker` (see :mod:`anatomy.hook.tracker_state`), above the
snapshots (:mod:`anatomy.hook.snapshots`); the step's life cycle (:mod:`anatomy.hook.tracker`) is above it.
"""

from __future__ import annotations

import math
import time
from time import perf_counter

from anatomy.hook.guard import Feature
from anatomy.hook.record import StepRecord
from anatomy.hook.sampled import TRACE
from anatomy.hook.schedule import RECENT_STEPS, REFRESH
from anatomy.hook.snapshots import StepSnapshots
from anatomy.hook.timing import (
    BEGIN,
    END,
    FORWARD_POST,
    FORWARD_PRE,
    OPTIMIZER_POST,
    OPTIMIZER_PRE,
    StepClock,
    durations_from_marks,
)
from anatomy.step_feed import MASK, PEAK, WIDTH

_NAN = math.nan


class OrdinarySteps(StepSnapshots):
    """A step's beginning, and an ordinary step's O(1) end."""

    def _begin(self, auto: bool, samples: int | None = None, tokens: int | None = None) -> None:
        # The per-step path: a section per hook (try/except, the guard's contract), no call it can spare.
        off = self._guard.off
        try:
            index = self._steps_done
            sched = self._schedule
            # One compare says whether anything can be due by the step count (an ordinary step: none of
            # the schedule's checks); a change the hooks saw, or a re-sum forced, is not ordinary.
            quiet = index < self._quiet_until and index != self._forced_refresh
            quiet = quiet and not self._model_watch.suspect
            if quiet and self._plain_ok:
                # An ordinary step on the host clock: begun in O(1) if the probe parameter has not moved
                # (the look _model_changed takes, written out).
                probe = self._probe_ref() if self._probe_ref is not None else None
                if probe is not None and probe.data_ptr() == self._probe_data:
                    rec = self._spare
                    if rec is not None:  # the record of the step before the last, ended plain: reused
                        self._spare = None
                        rec.index, rec.auto, rec.samples, rec.tokens = index, auto, samples, tokens
                        rec.micro = rec.samples_seen = rec.tokens_seen = rec.in_forward = 0
                        rec.grads = rec.opt_after = None
                        rec.optimizer_ran = rec.in_optimizer = rec.updated = rec.suspended = False
                        rec.recall = rec.counting = rec.window = False
                        rec.blocks = 1
                        rec.clock.marks.clear()
                    else:
                        rec = StepRecord(index, auto, samples, tokens, StepClock(False))
                        rec.quiet = rec.plain = True
                        rec.heap_on = False
                    sums = self._sums
                    rec.opt_begin = sums.optimizer_states
                    rec.grads_begin = sums.gradients if probe.grad is not None else 0
                    self._step = rec
                    rec.started = now = perf_counter()
                    rec.clock.marks.append((BEGIN, now))
                    return
            if self._model_changed(index, quiet):  # a new head, an untied embedding, .to(): all sums anew
                self._forced_refresh = index
                quiet = False
            clock = self._step_clock(self._cuda_events and Feature.TIMING not in off)
            rec = StepRecord(index, auto, samples, tokens, clock)
            rec.started = time.perf_counter()
            self._step = rec
            sums = self._sums
            rec.opt_begin = sums.optimizer_states
            ref = self._probe_ref
            probe = ref() if ref is not None else None
            rec.grads_begin = sums.gradients if probe is not None and probe.grad is not None else 0
            if self._zero_ref is not None:  # DeepSpeed's buffers, not param.grad: as last measured at a start
                rec.grads_begin = self._zero_grads_begin
            rec.quiet = quiet
            rec.refresh = not quiet and (sched.refresh_due(index) or index == self._forced_refresh)
            if rec.refresh:
                began = time.perf_counter()
                self._refresh_weights()
                rec.grads_begin = sums.gradients = self._gradient_bytes()
                self._zero_grads_begin = rec.grads_begin
                sched.charge(REFRESH, time.perf_counter() - began, index)
            kind = self._sampled_kind(index, quiet)  # (a trace reads the heap from the step's start)
            rec.heap_on = not quiet and (sched.heap_due(index) or kind == TRACE)
            memory = self._memory
            if rec.heap_on and memory is not None:  # (a step that does not read the heap reads nothing)
                memory.read_start(rec)
            if Feature.TIMING not in off:
                clock.mark(BEGIN)
            if kind is not None:
                self._start_sampled(rec, kind)
        except Exception as exc:
            self._guard.fail(Feature.STEP, exc)

    def _end_plain(self, rec: StepRecord) -> bool:
        """An ordinary step ends in O(1): its numbers go to the step feed as a row (the snapshot the last
        one built, with this step's number, time and timing, is made from it only where it is wanted).
        Only where every other figure would come out the same as the last build's — the step stayed
        plain, the same micro-batches, batch size and gradients at its start, no new error, no change
        waiting to be published; False: the step ends the full way."""
        if rec.window or rec.in_forward or rec.index == self._forced_refresh or self._hello_stale:
            return False
        if rec.micro != self._base_micro or rec.grads_begin != self._base_grads_begin:
            return False
        if self._guard.version != self._built_errors:
            return False
        samples = rec.samples if rec.samples is not None else self._throughput.default_samples
        if samples is None:
            samples = rec.samples_seen or None
        if samples != self._base_samples:
            return False
        t = perf_counter()
        if t - self._last_built >= self._rebuild_after_s:
            return False
        self._step = None
        index = rec.index
        self._steps_done = index + 1
        marks = rec.clock.marks
        marks.append((END, t))
        step_s = t - marks[0][1]
        if (
            len(marks) == 6
            and marks[1][0] is FORWARD_PRE
            and marks[2][0] is FORWARD_POST
            and marks[3][0] is OPTIMIZER_PRE
            and marks[4][0] is OPTIMIZER_POST
        ):  # the usual step: its phases read in place
            forward_s = marks[2][1] - marks[1][1]
            backward_s = marks[3][1] - marks[2][1]
            optimizer_s = marks[4][1] - marks[3][1]
        else:
            d = durations_from_marks(marks)
            forward_s = backward_s = optimizer_s = _NAN
            if d is not None:
                forward_s = _NAN if d.forward_s is None else d.forward_s
                backward_s = _NAN if d.backward_s is None else d.backward_s
                optimizer_s = _NAN if d.optimizer_s is None else d.optimizer_s
        sched = self._schedule
        sched.trained_s += step_s  # (the budget's clock)
        if step_s > 0:  # the schedule's pace (Schedule.note_step_s, written out)
            sched.recent_step_s[sched.noted % RECENT_STEPS] = step_s
            sched.noted += 1
        tokens = rec.tokens if rec.tokens is not None else self._throughput.default_tokens
        if tokens is None:
            tokens = rec.tokens_seen
        seq = self._seq = self._seq + 1
        # The row (StepFeed.put, written out: floats into the preallocated ring, no object made).
        feed = self._feed
        w = feed.written
        o = (w & MASK) * WIDTH
        v = feed.values
        v[o] = index
        v[o + 1] = seq
        v[o + 2] = time.time()
        v[o + 3] = step_s
        v[o + 4] = forward_s
        v[o + 5] = backward_s
        v[o + 6] = optimizer_s
        v[o + 7] = samples / step_s if samples and step_s > 0 else _NAN
        v[o + 8] = tokens / step_s if tokens and step_s > 0 else _NAN
        v[o + PEAK] = self._base_peak
        feed.bases[w & MASK] = self._latest
        feed.written = w + 1
        last = self._finished
        if last is not None and last.plain:  # (a record that ended plain is referenced nowhere else)
            self._spare = last
        self._finished = rec
        if index + 1 >= self._quiet_until:
            self._quiet_until = self._schedule.quiet_until(index + 1, self._looked_at)
        if rec.auto and not self._compile_safe and self._compiled():
            self._keep_out_of_compile()
        return True
