"""How a step begins and ends: in full, or as an ordinary step in O(1).

A step begins in :meth:`OrdinarySteps._begin`: the schedule's checks, the re-sums, the heap's first read and a
sampled step's instruments, where any is due — or, on an ordinary step (nothing due by the step count, no
change seen), nothing but a :class:`~anatomy.hook.lean.LeanStep` begun (no record made) and the clock read (on
a CUDA step the device times, also an event recorded: ``DEVICE_EVERY_S``). The hooks move it through the usual
step; it ends in O(1) (:meth:`OrdinarySteps._end_ordinary`): its numbers go to the step feed as one row of
floats, no snapshot and no object made; the snapshot (the last one built, with the step's number, time and
timing) is made from the row only where one is wanted (:mod:`anatomy.step_feed`). A step that became a record
while it measured nothing ends the same way (:meth:`OrdinarySteps._end_plain`); any other ends in full
(:meth:`OrdinarySteps._finish`).

A layer of :class:`~anatomy.hook.tracker.Tracker` (see :mod:`anatomy.hook.tracker_state`), above the
snapshots (:mod:`anatomy.hook.snapshots`); the step's life cycle (:mod:`anatomy.hook.tracker`) is above it.
"""

from __future__ import annotations

import math
import time
from time import perf_counter

from anatomy.hook.backend import CudaBackend, HeapBackend, MemoryBackend
from anatomy.hook.distributed import communication_bytes, ddp_buckets
from anatomy.hook.guard import Feature
from anatomy.hook.lean import (
    BEGUN,
    BETWEEN,
    PHASE_AT,
    DeviceTimed,
)
from anatomy.hook.record import StepRecord
from anatomy.hook.sampled import TRACE
from anatomy.hook.schedule import HEAP, RECENT_STEPS, REFRESH, SAMPLED
from anatomy.hook.snapshots import StepSnapshots
from anatomy.hook.split import explained_after_optimizer, held_after_optimizer, step_parts
from anatomy.hook.timing import (
    BEGIN,
    END,
    StepClock,
    durations_from_marks,
)
from anatomy.step_feed import MASK, PEAK, WIDTH
from anatomy.vocabulary import Phase

_NAN = math.nan
# An ordinary step begins and ends in O(1) (on a LeanStep); off, every step goes the full way — what the
# tests compare the O(1) path with.
ORDINARY_IN_O1 = True
# On CUDA an ordinary step records CUDA events (six, each ~2-8 µs with the stream lookup, then a query and
# four elapsed times: on an H200, under cProfile, about 125 of the 432 µs the hook added to a 1.3 ms step;
# benchmarks/gpu_runs/2026-11-28) only where a tenth of the publish interval, at most 50 ms, has passed since
# the last step that did; every other step's row carries the newest device times resolved (a step's times on
# the device are what the reader shows, never the host's launch time). A reader takes about two snapshots a
# second: it sees times at most ~50 ms older than its step, as it already saw them a few steps late (read only
# once the device has caught up).
DEVICE_SHARE = 0.1
DEVICE_EVERY_S = 0.05


class OrdinarySteps(StepSnapshots):
    """A step's beginning, and an ordinary step's O(1) end."""

    def _begin(self, auto: bool, samples: int | None = None, tokens: int | None = None) -> None:
        # The per-step path: a section per hook (try/except, the guard's contract), no call it can spare.
        try:
            index = self._steps_done
            # One compare says whether anything can be due by the step count (an ordinary step: none of
            # the schedule's checks); a change the hooks saw, or a re-sum forced, is not ordinary.
            quiet = index < self._quiet_until and index != self._forced_refresh
            quiet = quiet and not self._model_watch.suspect
            if quiet and self._plain_ok and not self._counter.active:
                # An ordinary step on the host clock: begun in O(1) if the probe parameter has not moved
                # (the look _model_changed takes, written out), as a lean step (the one before it kept).
                probe = self._probe_ref() if self._probe_ref is not None else None
                if probe is not None and probe.data_ptr() == self._probe_data:
                    lean = self._lean_other
                    self._lean_other = self._lean
                    self._lean = lean
                    lean.index, lean.auto, lean.samples, lean.tokens = index, auto, samples, tokens
                    # (the update moves the version: a record made of this step may let the next ones rest)
                    witness = self._witness_ref() if self._witness_ref is not None else None
                    lean.version = witness._version if witness is not None else -1
                    lean.stage = BEGUN
                    lean.framework = lean.closure = False
                    lean.depth = 0
                    lean.backward_ended = 0.0
                    sums = self._sums
                    lean.opt_begin = sums.optimizer_states
                    lean.grads_begin = sums.gradients if probe.grad is not None else 0
                    lean.active = True
                    lean.clock = None
                    if self._lean_on_device:  # (CUDA: some steps' events beside the host times)
                        now = perf_counter()
                        if now >= self._device_due:
                            self._device_due = now + min(self.interval_s * DEVICE_SHARE, DEVICE_EVERY_S)
                            device = lean.clock = self._clock_ring.take()
                            device.mark(BEGIN)
                    lean.started = perf_counter()
                    lean.resting = False  # (a resting step begins in RestingSteps._rest_begin)
                    if self._resting:  # (this step watches its forward: the hooks back)
                        self._hooks_on()
                    return
            self._gate.close()  # (a step ended in full says again whether the next ones rest)
            if self._resting:  # a step the hooks watch in full: its forward too
                self._hooks_on()
            off = self._guard.off
            sched = self._schedule
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
            # (a re-sum may choose anew)
            witness = self._witness_ref() if self._witness_ref is not None else None
            rec.version = witness._version if witness is not None else -1
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

    def _finish(self, rec: StepRecord, exc: BaseException | None) -> None:
        if rec.trace is not None:  # entered after the profiler: leaves first
            self._stop_trace(rec)
        if rec.profiler is not None:
            self._stop_profiler(rec, exc)
        off = self._guard.off
        if Feature.TIMING not in off:
            rec.clock.mark(END)
        memory = self._memory
        if memory is not None and not rec.optimizer_ran and rec.heap_on:
            # otherwise the optimizer's readings already cover the step's end
            memory.read(
                rec, Phase.OTHER, explained_after_optimizer(rec), held_after_optimizer(rec, self._sums)
            )
        since_built = perf_counter() - self._last_built
        due = exc is not None or self._steps_done == 0 or since_built >= self.interval_s
        if memory is not None:
            heap_step = memory.step_ends(rec, stats_due=due)
            if heap_step is not None:
                self._schedule.heap_step = heap_step
            if memory.runtime is None and rec.heap_from is None and isinstance(memory, HeapBackend):
                comm = communication_bytes(self._sums.buckets, rec.grads_begin) or 0
                # other models built before the first step are named, not runtime
                memory.measure_runtime(rec, step_parts(rec, self._sums), comm + self._sums.other_models)
        if rec.refresh or rec.index == self._forced_refresh:
            self._sums.step = rec.index  # (what it re-summed: the figures' step)
        if (rec.refresh or rec.index == self._forced_refresh) and Feature.GRADIENTS not in off:
            with self._guard(Feature.GRADIENTS):  # DDP's buckets, rebuilt after the first backward
                self._sums.buckets = ddp_buckets(self.model) or self._zero_buckets()
            if rec.grads is None and Feature.GRADIENTS not in off:
                # No optimizer hook saw this step: gradients as they are now.
                with self._guard(Feature.GRADIENTS):
                    rec.grads = self._gradient_bytes()
                    self._sums.gradients = rec.grads
        self._steps_done += 1
        if rec.started:  # (the budget's clock: the time steps take)
            self._schedule.trained_s += perf_counter() - rec.started
        # (a step begun by begin_step: the next begin_step looks, before the next forward)
        if rec.auto and not self._compile_safe and self._compiled():
            self._keep_out_of_compile()
        if rec.heap_on or rec.began_s:
            self._charge(rec, memory)
        throughput = self._throughput
        throughput.on_device = self._cuda_events  # (a step not timed there leaves the device's times)
        throughput.step_finished(rec)
        groups_step = throughput.op_groups_step
        throughput.resolve()
        self._finished = rec
        self._finished_lean = False
        if self._steps_done >= self._quiet_until:  # (the steps per interval: as of this step's time)
            self._quiet_until = self._schedule.quiet_until(self._steps_done, self._looked_at)
        if self._episode:  # a sampled episode in progress: its next piece on the next step
            self._quiet_until = self._steps_done
        build = exc is not None or self._steps_done == 1 or since_built >= self._rebuild_after_s
        if build or groups_step != throughput.op_groups_step or not self._repeat(rec):
            self._build(rec)
            self._publish_latest()
        # The next ordinary step may begin and end in O(1) (a LeanStep). On the host clock: where nothing
        # of an earlier step is still to be resolved. On CUDA: its events go to the throughput's queue in
        # order with every other step's (no op-group profile waiting), and it reads the allocator once, at
        # its end (CudaBackend.lean_steady), once a step has read it in full.
        off = self._guard.off
        on_device = self._cuda_events
        cuda = memory if isinstance(memory, CudaBackend) else None
        read_ok = cuda is None or (Feature.CUDA not in off and cuda.steady is not None)
        self._plain_ok = (
            ORDINARY_IN_O1
            and (on_device or self._step_clock is StepClock)
            and read_ok
            and self._probe_data is not None
            and self._zero_ref is None
            and Feature.TIMING not in off
            and Feature.CHANGES not in off
            and (throughput.profiles_idle if on_device else throughput.idle)
            and self._latest is not None
        )
        self._lean_on_device = on_device
        self._lean_check = cuda.lean_steady if cuda is not None else None
        if exc is None:
            self._rest_allow(rec)
        else:
            self._gate.close()
        shape = self._schedule.input_shape if self._batch_shape is not None else None
        if shape != self._lean.shape:  # the batch shape an ordinary step's forward may have
            self._lean.learn_shape(shape)
            self._lean_other.learn_shape(shape)

    def _charge(self, rec: StepRecord, memory: MemoryBackend | None) -> None:
        """What this step's optional work cost, to the schedule's budget."""
        sched = self._schedule
        if memory is not None and rec.heap_on:
            sched.charge(HEAP, memory.take_spent(), rec.index)
        if rec.began_s:  # a sampled step: the profiler and the trace cost what the step took beyond the usual
            took = time.perf_counter() - rec.began_s
            sched.charge(SAMPLED, max(took - sched.median_step_s, 0.0), rec.index)

    def _end_plain(self, rec: StepRecord) -> bool:
        """An ordinary step that became a record (something beyond the usual step happened, yet nothing
        was measured) ends in O(1) all the same where :meth:`_end_ordinary` allows; False: the full way."""
        if rec.window or rec.in_forward or rec.clock.cuda or rec.cuda_start is not None:
            return False  # (a record timed on the device, or one that read the allocator: the full way)
        t = perf_counter()
        marks = rec.clock.marks
        d = durations_from_marks([*marks, (END, t)])  # (the usual step's are read in place, on a LeanStep)
        forward_s = backward_s = optimizer_s = _NAN
        if d is not None:
            forward_s = _NAN if d.forward_s is None else d.forward_s
            backward_s = _NAN if d.backward_s is None else d.backward_s
            optimizer_s = _NAN if d.optimizer_s is None else d.optimizer_s
        index = rec.index
        if not self._end_ordinary(
            index,
            rec.auto,
            rec.micro,
            rec.grads_begin,
            rec.samples,
            rec.tokens,
            rec.samples_seen,
            rec.tokens_seen,
            marks[0][1],
            t,
            forward_s,
            backward_s,
            optimizer_s,
        ):
            return False
        self._step = None
        marks.append((END, t))
        last = self._finished
        if last is not None and last.plain and not self._finished_lean:  # (referenced nowhere else)
            self._spare = last
        self._finished = rec
        self._finished_lean = False
        return True

    def _end_ordinary(
        self,
        index: int,
        auto: bool,
        micro: int,
        grads_begin: int,
        samples: int | None,
        tokens: int | None,
        samples_seen: int,
        tokens_seen: int,
        started: float,
        t: float,
        forward_s: float,
        backward_s: float,
        optimizer_s: float,
        device: StepClock | None = None,
        resting: bool = False,
    ) -> bool:
        """An ordinary step ends in O(1): its numbers go to the step feed as a row (the snapshot the last
        one built, with this step's number, time and timing, is made from it only where it is wanted).
        Only where every other figure would come out the same as the last build's — the same
        micro-batches, batch size and gradients at its start, no new error, no change waiting to be
        published; False: the step ends the full way (nothing done here). ``samples`` and ``tokens`` as the
        step was told them (None: the tracker's defaults, else what its forwards saw). ``resting``: its
        forward ran unwatched — a rebuild due by the clock waits for the next step that looks, whose build
        has forward and backward times to show."""
        if samples is None:
            samples = self._throughput.default_samples
            if samples is None:
                samples = samples_seen or None
        if tokens is None:
            tokens = self._throughput.default_tokens
            if tokens is None:
                tokens = tokens_seen
        if index == self._forced_refresh or self._hello_stale or micro != self._base_micro:
            return False
        if grads_begin != self._base_grads_begin or self._guard.version != self._built_errors:
            return False
        if samples != self._base_samples:
            return False
        if not resting and t - self._last_built >= self._rebuild_after_s:
            return False  # (a resting step leaves the rebuild to the next look: it has no forward times)
        self._steps_done = index + 1
        step_s = t - started
        sched = self._schedule
        sched.trained_s += step_s  # (the budget's clock: the training thread's time)
        if device is None and not self._lean_on_device:
            if step_s > 0:  # the schedule's pace (Schedule.note_step_s, written out)
                sched.recent_step_s[sched.noted % RECENT_STEPS] = step_s
                sched.noted += 1
            samples_per_s = samples / step_s if samples and step_s > 0 else _NAN
            tokens_per_s = tokens / step_s if tokens and step_s > 0 else _NAN
        else:  # on CUDA: the row has the newest device times that can be read (never waits)
            throughput = self._throughput
            if device is not None:  # (a step timed on the device: its events queued)
                device.mark(END)
                throughput.device_step(DeviceTimed(index, samples, tokens), device)
            if throughput.pending:
                throughput.resolve()  # (the pace: noted as each resolves)
                throughput.update_timing()
            timing = throughput.timing
            step_s = _NAN if timing.step_s is None else timing.step_s
            forward_s = _NAN if timing.forward_s is None else timing.forward_s
            backward_s = _NAN if timing.backward_s is None else timing.backward_s
            optimizer_s = _NAN if timing.optimizer_s is None else timing.optimizer_s
            samples_per_s = _NAN if timing.samples_per_s is None else timing.samples_per_s
            tokens_per_s = _NAN if timing.tokens_per_s is None else timing.tokens_per_s
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
        v[o + 7] = samples_per_s
        v[o + 8] = tokens_per_s
        v[o + PEAK] = self._base_peak
        feed.bases[w & MASK] = self._latest
        feed.written = w + 1
        if index + 1 >= self._quiet_until:
            self._quiet_until = self._gate.until = self._schedule.quiet_until(index + 1, self._looked_at)
        if auto and not self._compile_safe and self._compiled():
            self._keep_out_of_compile()
        return True

    def _promote(self) -> StepRecord:
        """The lean step in progress goes on as a record, on the general path."""
        lean = self._lean
        sums = self._sums
        updated = False
        if lean.stage == BETWEEN:  # (its optimizer stepped after the block, outside any: as a record sees)
            witness = self._gate.witness()
            updated = witness is not None and witness._version != lean.version
        rec = lean.record(
            self._spare,
            sums.gradients,
            sums.optimizer_states,
            self._lean_on_device,
            self._gate.micro,
            updated,
        )
        lean.active = False
        self._gate.close()  # (a step that stopped being ordinary: the next look says again)
        if lean.resting:  # the rest of the step goes on watched
            lean.resting = False
            self._model_watch.resume()
            self._hooks_on()
        if lean.clock is None:
            self._spare = None
        memory = self._memory
        if lean.stage != BEGUN and isinstance(memory, CudaBackend):
            memory.lean_promoted(rec, PHASE_AT[lean.stage])  # (before its first forward: read from there)
        self._step = rec
        return rec

    def _last_record(self) -> StepRecord | None:
        """The last finished step's record (made from its lean state where it ended lean)."""
        if self._finished_lean:
            lean = self._lean_other if self._lean.active else self._lean
            sums = self._sums
            rec = self._finished = lean.record(
                None, sums.gradients, sums.optimizer_states, self._lean_on_device, self._gate.micro
            )
            self._finished_lean = False
            memory = self._memory
            if isinstance(memory, CudaBackend):
                memory.lean_finished(rec)
        return self._finished
