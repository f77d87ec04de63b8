"""The in-process hook: ``tracker = anatomy.track(model, optimizer)``.

Phase boundaries come from hooks — the model's forward pre/post hooks and the optimizer's step
pre/post hooks — so the same code serves a plain loop and the Hugging Face Trainer. Step
boundaries come from ``tracker.step()`` / ``begin_step``/``end_step`` (or the Trainer callback); a
loop that uses neither still gets steps: a training-mode forward begins one and the optimizer step
ends it.

An ordinary step only marks its phases on a clock and leaves one row of numbers in the step feed; what
else runs when (saved-tensor counting, heap reads, re-sums, sampled steps) is
:mod:`anatomy.hook.schedule`'s.

This module keeps the step's life cycle — where a step begins, goes on over step blocks, ends or is
dropped — and ``track()``. The :class:`Tracker` is built in layers below it (declared in
:mod:`anatomy.hook.tracker_state`): the set-up (:mod:`anatomy.hook.attach`), the sampled step's
instruments (:mod:`anatomy.hook.sampled`), the saved-tensor count's window (:mod:`anatomy.hook.window`),
the phase hooks (:mod:`anatomy.hook.phases`), the finished step's snapshot (:mod:`anatomy.hook.snapshots`,
whose figures the pure :mod:`anatomy.hook.assembly` computes) and a step's beginning and end, the ordinary
step's in O(1) on a :mod:`anatomy.hook.lean` step (:mod:`anatomy.hook.ordinary`).

What a snapshot's numbers mean. ``memory`` holds each component at its own maximum in the step:
weights (parameters + buffers, plus autocast's low-precision weight copies), optimizer states and
gradients are exact tensor sums; activations are the bytes saved for backward by one forward (the
largest micro-batch). ``peak_bytes`` is the step's peak of memory in use — on CUDA the caching
allocator's peak allocated bytes; on CPU glibc's heap in use at the peak, absolute (read at the phase
boundaries, and after every op on traced steps) — and ``peak_phase`` where it happened.
``at_peak`` splits that peak into what each component held at its moment, summing to ``peak_bytes``
exactly: unattributed is what was in use at the step's start besides weights, optimizer states and
gradients (on CPU: the interpreter, libraries, the batch; constant through the step); weights,
optimizer states, gradients and activations are what was alive at the peak (the per-op trace of a
sampled step knows the moment: saved tensors still held, gradients made so far; between traces the
last traced split stands, ``at_peak_step`` says from which step); temporaries are the rest.

Nothing raised in here reaches the training loop: a failing measurement is logged once, becomes
unmeasured (None) and the snapshot's ``error`` says why (:mod:`anatomy.hook.guard`). Only the user's
own exceptions propagate.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from time import perf_counter
from typing import Any, Literal

import torch

from anatomy.hook.backend import BackendFactory
from anatomy.hook.compiled import CompileProbe
from anatomy.hook.detect import is_oom
from anatomy.hook.guard import Feature, Guard
from anatomy.hook.lean import UPDATED, LeanStep
from anatomy.hook.others import OtherModels
from anatomy.hook.publishing import Channel
from anatomy.hook.record import StepRecord, Sums
from anatomy.hook.rest_gate import RestGate
from anatomy.hook.resting import RestingSteps
from anatomy.hook.schedule import (
    SAMPLE_EVERY,
    WARMUP_REFRESH_STEPS,
    Schedule,
)
from anatomy.hook.step_context import NullContext, StepContext
from anatomy.hook.throughput import Throughput
from anatomy.hook.timing import (
    BACKWARD_END,
    ClockFactory,
    ClockRing,
    StepClock,
)
from anatomy.hook.warm import warm_instruments
from anatomy.recorder import RecordSetting
from anatomy.step_feed import FeedHistory, StepFeed
from anatomy.vocabulary import Precision

HISTORY_LENGTH = 120
# An ordinary step's snapshot is the last one built in full, repeated; one is built anew at least this many
# publish intervals apart all the same (the rates and the advice move with the median step time).
REBUILD_INTERVALS = 10
_NAN = math.nan
log = logging.getLogger("anatomy")
MAX_MERGED_BLOCKS = 4096  # blocks without an optimizer update merged into one step, at most
_DISCARDED = RuntimeError("trailing micro-batches without an optimizer update")


def _plus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def hook_disabled() -> bool:
    """``ANATOMY_TOP=0`` (or false/no/off) in the environment: the hook attaches nothing."""
    return os.environ.get("ANATOMY_TOP", "").strip().lower() in ("0", "false", "no", "off")


class Tracker(RestingSteps):
    """Measures each training step of ``model`` (and ``optimizer``) and publishes a snapshot per step.

    Use ``with tracker.step(samples=..., tokens=...):`` around each optimizer step (or
    ``begin_step``/``end_step``), then ``close()`` (or use the tracker as a context manager).
    A tracker with ``enabled=False`` (``ANATOMY_TOP=0``, or a set-up that failed) is a null tracker:
    the same API, nothing attached, nothing measured.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Any = None,
        *,
        publish: bool = True,
        interval_s: float = 0.5,
        sample_every: int = SAMPLE_EVERY,
        samples: int | None = None,
        tokens: int | None = None,
        grad_accum_steps: int = 1,
        precision: Precision | None = None,
        directory: Path | None = None,
        enabled: bool = True,
        record: RecordSetting = None,
        others: Mapping[str, torch.nn.Module] | None = None,
        memory_backend: BackendFactory | None = None,
        step_clock: ClockFactory = StepClock,
    ) -> None:
        """``memory_backend``: makes the memory backend for the model's device (by default the caching
        allocator's on CUDA, glibc's heap on the CPU); ``step_clock``: makes each step's clock (by default
        a :class:`~anatomy.hook.timing.StepClock` on CUDA events where the model is on CUDA). Both are
        for tests: a simulated allocator, a counting heap, fake events."""
        # Every attribute is declared, with what it means, in anatomy.hook.tracker_state.
        self.enabled = enabled
        self.model = model
        self.interval_s = float(interval_s)
        self.grad_accum_steps = max(int(grad_accum_steps or 1), 1)
        # Every finished step, raw (the training thread writes, the publisher's thread and readers make
        # snapshots of it); ``history`` shows its last steps.
        self._feed = StepFeed()
        self.history = FeedHistory(self._feed, HISTORY_LENGTH)
        self._guard = Guard()
        self._schedule = Schedule(sample_every, self.interval_s)
        # What a resting step reads (one small object: anatomy.hook.resting); closed by any failure.
        self._gate = RestGate()
        self._guard.listeners.append(self._gate.close)
        self._throughput = Throughput(self._guard, self._schedule, samples, tokens)
        self._channel = Channel(
            self._guard,
            enabled=publish,
            interval_s=self.interval_s,
            directory=directory,
            record=record,
            feed=self._feed,
        )
        self._sums = Sums()
        # the set-up
        self._precision_override = precision
        self._optimizer_ref = self._zero_ref = None
        self._zero_grads_begin = self._managed = 0
        self._extra_optimizers = []
        self._kind_of = None
        self._hello, self._hello_stale = None, False
        self._opt_handles, self._handles = [], []
        self._started_at = time.time()
        self._expected = None
        self._autocast_dtype, self._grad_scaler = None, False
        self._device, self._cuda_events = None, False
        self._step_clock, self._backend_factory = step_clock, memory_backend
        self._clock_ring = ClockRing(step_clock)
        self._heap, self._memory = None, None
        self._param_count, self._param_dtype, self._trainable_count = 0, torch.float32, 0
        self._quantization = None
        self._others = OtherModels()
        for name, module in (others or {}).items():
            if isinstance(module, torch.nn.Module):
                self._others.add(name, module)
        self._compile_safe = False
        self._compiled = CompileProbe(model)
        # the steps
        self._step = self._finished = None
        self._explicit = self._closed = False
        self._unseen_updates = self._steps_done = 0
        self._forced_refresh = -1
        self._quiet_until = self._looked_at = 0
        self._batch_shape = self._target_shape = None
        self._context: StepContext[Tracker] = StepContext(self, None, None)  # what step() returns, reused
        self._plain_ok = self._lean_on_device = False
        self._device_due = 0.0
        self._resting, self._no_rest, self._framework_rests = False, False, False
        self._lean_check = None
        self._episode, self._plan, self._blocks, self._per_piece, self._traced_best = [], None, [], {}, None
        self._fastest_piece_s = math.inf
        self._spare = None
        self._lean, self._lean_other, self._finished_lean = LeanStep(), LeanStep(), False
        # snapshots and publishing
        self._seq = 0
        self._latest = None
        self._last_built = 0.0
        self._rebuild_after_s = REBUILD_INTERVALS * self.interval_s
        self._built_stamp, self._built_errors = None, 0
        self._base_micro, self._base_samples, self._base_grads_begin, self._base_peak = -1, None, 0, _NAN
        self._balance_logged = False
        self._suggestions, self._advised_at = [], -1e9
        self._oom_recorded, self._oom_path = None, None
        if not enabled:
            return
        with self._guard(Feature.SETUP):
            self._setup(model, optimizer)
        if not self._guard.ok(Feature.SETUP):  # a null tracker from here: nothing stays attached
            self._detach()
            self.enabled = False
            return
        # The socket and the publisher's thread start with the set-up, the hello as it stands: on the first
        # step's end they held it up by ~0.8 ms, a usual step of a small model (issue 19). A monitor meanwhile
        # shows the process with its model, waiting for a step.
        if self._channel.enabled:  # (nothing to start: the hello is built when a step needs it)
            with self._guard(Feature.PUBLISH):
                self._publish_latest()
        if self._schedule.sample_every > 0:  # (step 1 is sampled: its first-time costs paid here)
            warm_instruments()

    @property
    def steps_done(self) -> int:
        """Steps finished so far: the index of the step in progress, if one is."""
        return self._steps_done

    @property
    def sample_every(self) -> int:
        return self._schedule.sample_every

    @property
    def default_samples(self) -> int | None:
        return self._throughput.default_samples

    @property
    def default_tokens(self) -> int | None:
        return self._throughput.default_tokens

    # -- step boundaries ---------------------------------------------------------------------------

    def step(
        self, samples: int | None = None, tokens: int | None = None
    ) -> StepContext[Tracker] | NullContext[Tracker]:
        """Context manager around one optimizer step (all its micro-batches)."""
        if not self.enabled or self._closed:
            return NullContext(self)
        ctx = self._context  # one, reused: its values are read as it is entered
        if ctx.entered:  # (a step inside a step: its own)
            return StepContext(self, samples, tokens)
        ctx.samples, ctx.tokens = samples, tokens
        return ctx

    def begin_step(self, samples: int | None = None, tokens: int | None = None) -> None:
        """A step block begins. Blocks in which no optimizer updates (gradient accumulation, a skipped
        fp16 step, accelerate's non-sync micro-batches) are micro-batches of the next step that does."""
        if self._gate.ok and self._rest_begin(samples, tokens):
            return  # (a resting step: under no hook of ours)
        if not self.enabled or self._closed:
            return
        self._explicit = True
        if self._lean.active:  # (a block never ended)
            self._promote()
        rec = self._step
        if rec is not None:  # (none on an ordinary step)
            if not rec.suspended:
                self.end_step()  # (a block never ended)
                rec = self._step
            if rec is not None and rec.suspended and not rec.updated:
                with self._guard(Feature.STEP):
                    rec.suspended = False
                    rec.blocks += 1
                    rec.samples = _plus(rec.samples, samples)
                    rec.tokens = _plus(rec.tokens, tokens)
                return
            if rec is not None:  # suspended, and an optimizer stepped after its block (outside any block)
                self._finish_step(rec, None)
        if not self._compile_safe:  # (CompileProbe's test written out: no call on the per-step path)
            probe = self._compiled
            counters = probe.counters
            if counters is None and "torch._dynamo" in sys.modules:
                probe()  # learns Dynamo's counters, once
                counters = probe.counters
            frames = counters.get("frames") if counters is not None else None
            if (frames is not None and frames.get("ok")) or probe.model_dict.get("_compiled_call_impl"):
                self._keep_out_of_compile()
        self._begin(False, samples, tokens)

    def end_step(self, exc: BaseException | None = None) -> None:
        """Close the current step. With ``exc`` (the exception that ended it), an out-of-memory
        error writes the last snapshot with the error text to the OOM file."""
        lean = self._lean
        if lean.active:
            # (its update seen by the witness's version: no hook of ours saw it; none: the next block's)
            if lean.resting and exc is None and self._rest_updated(lean):
                return  # (resting between blocks: the next one goes on from here)
            if exc is None and lean.stage == UPDATED:
                try:  # the usual step ends in O(1) where _end_ordinary allows
                    t = perf_counter()
                    fpost, opre = lean.forward_post, lean.optimizer_pre
                    bend = lean.backward_ended or opre  # (a framework's backward end, else the optimizer)
                    check = self._lean_check
                    if (check is None or check()) and self._end_ordinary(
                        lean.index,
                        lean.auto,
                        lean.micro + self._gate.micro if lean.resting else 1,
                        lean.grads_begin,
                        lean.samples,
                        lean.tokens,
                        lean.samples_seen,
                        lean.tokens_seen,
                        lean.started,
                        t,
                        fpost - lean.forward_pre,
                        bend - fpost,
                        lean.optimizer_post - opre,
                        lean.clock,
                        lean.resting,
                    ):
                        lean.active = False
                        lean.ended = t
                        self._finished_lean = True
                        if lean.resting:  # (the registration watch rested through the step)
                            self._model_watch.resume()
                        return
                except Exception as error:
                    self._guard.fail(Feature.STEP, error)
            self._promote()
        rec = self._step
        if not self.enabled or rec is None or rec.suspended:
            if exc is not None and self.enabled and is_oom(exc):
                self._write_oom(exc)
            return
        if exc is None and not rec.updated and self._defers(rec):
            self._suspend(rec)
            return
        if rec.plain and exc is None:
            try:
                if self._end_plain(rec):
                    return
            except Exception as error:
                self._guard.fail(Feature.STEP, error)
        self._finish_step(rec, exc)
        if exc is not None and is_oom(exc):
            self._write_oom(exc)

    def _finish_step(self, rec: StepRecord, exc: BaseException | None) -> None:
        self._step = None
        if rec.in_forward:  # a forward that never returned (an exception a framework caught)
            self._model_watch.resume()
        if rec.window or self._counter.active:
            self._close_window(rec)
        try:
            self._finish(rec, exc)
        except Exception as error:
            self._guard.fail(Feature.STEP, error)

    def _defers(self, rec: StepRecord) -> bool:
        """Does a block that did not update continue into the next one? Only where an update can be
        seen (a tracked optimizer with step hooks), and not forever (a loop that never steps it)."""
        return bool(self._opt_handles) and rec.blocks < MAX_MERGED_BLOCKS

    def _suspend(self, rec: StepRecord) -> None:
        """The block ended without an optimizer update: the step goes on in the next block (what runs
        between blocks, data loading, is the step's "other" time)."""
        self._close_window(rec)
        with self._guard(Feature.STEP):
            rec.suspended = True
            if rec.in_forward:  # a forward left open (a framework's forward mark without a backward)
                rec.in_forward = 0
                self._model_watch.resume()
            if self._guard.ok(Feature.TIMING):
                rec.clock.mark(BACKWARD_END)

    def _discard(self, rec: StepRecord) -> None:
        """Trailing micro-batches that no update followed (the run ended): not a step."""
        self._step = None
        self._close_window(rec)
        with self._guard(Feature.STEP):
            if rec.trace is not None:
                self._stop_trace(rec)
            if rec.profiler is not None:
                self._stop_profiler(rec, _DISCARDED)

    def record_oom(self, exc: BaseException) -> Path | None:
        """For wrappers that catch an exception outside a step (the Trainer callback): if it is an
        out-of-memory error, end the step in progress and write the OOM file."""
        if not self.enabled or not is_oom(exc):
            return None
        if self._lean.active:
            self._promote()
        rec = self._step
        if rec is not None:
            self._finish_step(rec, exc)
        return self._write_oom(exc)

    # -- life cycle --------------------------------------------------------------------------------

    def close(self) -> None:
        """Detach every hook, publish the last snapshot and remove the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._gate.close()
        if not self.enabled:
            return
        if self._lean.active:
            self._promote()
        rec = self._step
        if rec is not None and rec.suspended and not rec.updated and self._steps_done > 0:
            self._discard(rec)
        elif rec is not None:
            self._finish_step(rec, None)
        with self._guard(Feature.SETUP):
            self._detach()
        with self._guard(Feature.ACTIVATIONS):
            self._counter.stop()  # (a window of a forward outside any step)
        self._channel.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def socket_path(self) -> Path | None:
        return self._channel.path

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is not None and is_oom(exc):
            self.record_oom(exc)
        elif exc is not None and self.enabled:
            self._channel.crashed(exc)  # the record ends "crashed", naming it
        self.close()
        return False


def track(
    model: torch.nn.Module,
    optimizer: Any = None,
    *,
    publish: bool = True,
    interval_s: float = 0.5,
    sample_every: int = SAMPLE_EVERY,
    samples: int | None = None,
    tokens: int | None = None,
    grad_accum_steps: int = 1,
    precision: Precision | None = None,
    directory: Path | None = None,
    record: RecordSetting = None,
    others: Mapping[str, torch.nn.Module] | None = None,
) -> Tracker:
    """Attach the anatomy hook to ``model`` (and ``optimizer``). ``others``: the other models the step
    runs, by name (``{"teacher": teacher}``; or later ``tracker.add_model``). ``record``: the flight
    recorder (None: as ``ANATOMY_TOP_RECORD`` says, on by default; False: off; a path: record there).
    With ``ANATOMY_TOP=0`` in the environment this returns a tracker that does nothing (same API)."""
    return Tracker(
        model,
        optimizer,
        publish=publish,
        interval_s=interval_s,
        sample_every=sample_every,
        samples=samples,
        tokens=tokens,
        grad_accum_steps=grad_accum_steps,
        precision=precision,
        directory=directory,
        enabled=not hook_disabled(),
        record=record,
        others=others,
    )


__all__ = ["SAMPLE_EVERY", "WARMUP_REFRESH_STEPS", "Tracker", "hook_disabled", "track"]
