"""Resting steps: an ordinary step told what its batch would tell runs under no hook of ours — its begin and
its end, a clock read at each, and nothing in between.

Where the last step that ended in full allows it (:meth:`RestingSteps._rest_allow`), the next ordinary steps
rest: the model's forward hooks, the optimizer's post-hook and the optimizer watch's global pre-hook are off
(torch's module call and optimizer step take their fast paths again), and the step is two calls of ours,
``begin_step`` and ``end_step``, that read one small object, :class:`~anatomy.hook.rest_gate.RestGate`, where
everything they need was set when the step that allowed it ended: how far the steps stay ordinary, the probe
parameter, the samples and gradients the last build had. That the optimizer updated, a resting step learns
from the probe parameter's version counter (the update moves it in place; the step that allowed resting saw it
move) — or, under an optimizer whose update moves no parameter's counter (a fused kernel, bitsandbytes'), from
the probe's step count in the optimizer's state (:meth:`RestingSteps._learn_witness`): it then ends in O(1) as
any ordinary step does (:meth:`~anatomy.hook.ordinary.OrdinarySteps._end_ordinary`). Its row has the step's
time alone: the reader shows the last build's forward, backward and optimizer times scaled to it
(:mod:`anatomy.step_feed`). On CUDA its row has the newest times the device resolved (a step the device
times is watched: every tenth of the publish interval, at most 50 ms, one step goes the lean way with our
hooks on), and the allocator is read once at its end, as on every ordinary CUDA step.

Under gradient accumulation a step rests as one of a single micro-batch does. Where its micro-batches are
blocks of their own (accelerate's ``accumulate``, the Trainer's and Lightning's accumulation), a block that
ends without an update rests between the blocks (``BETWEEN``: :meth:`RestingSteps._rest_updated`) while the
look's step had more, and the next block goes on from there told its share of the look's samples
(:meth:`RestingSteps._rest_next_block`); where they run in one block, the step takes the look's count of
forwards as it takes the look's one. Anything else — an update in an earlier block, none in the last, one
outside any block, a block of other samples or none told, an exception — makes the step the record the
general path holds at that point (between blocks: suspended), which goes on from there.

After a big step the hook's code and data are cold in the CPU caches and every line and every object touched
costs, so whatever can change between two looks closes the gate where it happens (``gate.ok = 0``: a
forced re-sum, a new set-up, a failure, a registration on the model, a framework's call, a promotion, a
build, ``close``) instead of being asked on every step. A step the gate does not let through — not told its
samples, other samples than the build's, a moved parameter, its gradients set where the build's were not,
the schedule's next look — goes the general way (:mod:`anatomy.hook.ordinary`), every hook back on.

What a resting step still checks itself: its samples and tokens, the probe parameter's storage and gradient,
the witness's version (``.to()``, ``zero_grad(set_to_none=...)`` and the update call no hook of ours), and the
step count against the look. What no hook sees while steps rest waits for the next look: an optimizer made
anew without telling the tracker, and anything compiled (a frame compiled while steps rest was traced without
our hooks either way: its step began before it; the look's ``begin_step`` wraps them before it puts them
back).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping
from time import perf_counter

import torch

from anatomy.hook.guard import Feature
from anatomy.hook.lean import (
    BETWEEN,
    FORWARD_DONE,
    IN_OPTIMIZER,
    NEED_SAMPLES,
    NEED_TOKENS,
    REST,
    REST_NEVER,
    UPDATED,
    LeanStep,
)
from anatomy.hook.ordinary import OrdinarySteps
from anatomy.hook.record import StepRecord
from anatomy.hook.rest_gate import ANY_GRAD, StepCount, no_parameter
from anatomy.hook.timing import FORWARD_PRE

_NAN = math.nan
# Ordinary steps may run with every hook of ours off (off: they always watch the forward) — what the
# tests compare resting steps with.
REST_ON = True


class RestingSteps(OrdinarySteps):
    """A resting step's begin and end, what allows it, and our hooks off and back on."""

    def _rest_begin(self, samples: int | None, tokens: int | None) -> bool:
        """Begin a resting step, where the gate lets it through (False: ``begin_step`` goes on)."""
        gate = self._gate
        try:
            if self._lean.active:  # (its next block, where it rests between two)
                return self._rest_next_block(samples, tokens)
            index = self._steps_done
            lean = self._lean_other  # (the two alternate: the one that ended stays readable)
            if index >= gate.until:
                return False
            if self._lean_on_device and perf_counter() >= self._device_due:
                return False  # (a step the device times: our hooks mark its phases, on the lean way)
            if (samples if samples is not None else gate.default_samples) != gate.block_samples:
                return False
            if tokens is None and gate.need_tokens:
                return False
            probe = gate.probe()
            if probe is None or probe.data_ptr() != gate.probe_data:
                return False
            if (probe.grad is not None) != gate.grads and gate.grads != ANY_GRAD:
                return False
            witness = gate.witness
            witness = probe if witness is gate.probe else witness()  # (one weak reference called, not two)
            if witness is None:
                return False
            self._lean_other = self._lean
            self._lean = lean
            if not lean.resting:
                self._prime(lean)
            lean.index, lean.samples, lean.tokens = index, samples, tokens
            lean.stage = FORWARD_DONE
            lean.backward_ended = 0.0
            lean.blocks = 1
            lean.micro = 0
            lean.version = witness._version
            lean.active = True
            if not self._resting:
                self._hooks_off()
            gate.regs.pop(gate.key, None)  # (ModelWatch.pause, written out: resumed as the step ends)
            lean.started = perf_counter()
            return True
        except Exception as exc:
            self._guard.fail(Feature.STEP, exc)
            return False

    def _rest_next_block(self, samples: int | None, tokens: int | None) -> bool:
        """The next block of a resting step that rests between two (gradient accumulation, a block a
        micro-batch: :meth:`_rest_updated`), where it is told its share of the look's samples (False: the
        step becomes the record the general path holds between blocks, which goes on from there)."""
        lean = self._lean
        gate = self._gate
        if lean.stage != BETWEEN or samples != gate.block_samples:
            return False
        if tokens is None and gate.need_tokens:
            return False
        witness = gate.witness()
        if witness is None or witness._version != lean.version:
            return False  # (its optimizer stepped after the last block: the record says so)
        lean.blocks += 1
        lean.samples += samples  # type: ignore[operator]  # (every block told: _rest_allow)
        lean.tokens = None if tokens is None or lean.tokens is None else lean.tokens + tokens
        lean.stage = FORWARD_DONE
        lean.backward_ended = 0.0
        return True

    def _prime(self, lean: LeanStep) -> None:
        """What every resting step of ``lean`` holds alike (until it is used another way: ``resting``
        False)."""
        gate = self._gate
        lean.auto = lean.framework = lean.closure = False
        lean.depth = 0
        lean.clock = None
        lean.forward_pre = lean.forward_post = _NAN
        lean.samples_seen = lean.tokens_seen = 0
        lean.grads_begin, lean.opt_begin = gate.start_grads, gate.opt_states
        lean.resting = True

    def _rest_updated(self, lean: LeanStep) -> bool:
        """A resting step's block ends: where the witness's version moved (the optimizer updated, under no
        hook of ours), it is at ``UPDATED`` — its optimizer not timed (NaN) unless a framework's
        ``optimizer_begin``/``optimizer_end`` timed it — and ends in O(1) as any ordinary step does
        (``_end_ordinary``); where nothing moved, it is a block without an update, which the next block
        continues: resting between the two (``BETWEEN``; True) while the look's step had more blocks,
        else as the record the general path holds between blocks."""
        try:
            stage = lean.stage
            if stage in (UPDATED, BETWEEN):  # (BETWEEN: an end without a begin, as a record)
                return False
            gate = self._gate
            witness = gate.witness()
            if witness is None or witness._version == lean.version:  # (no update)
                if lean.blocks < gate.blocks and stage == FORWARD_DONE and gate.ok:
                    lean.micro += gate.micro
                    lean.stage = BETWEEN
                    lean.backward_ended = perf_counter()
                    return True
                return False
            if stage != IN_OPTIMIZER or not lean.optimizer_post >= lean.optimizer_pre:
                lean.optimizer_pre = lean.optimizer_post = _NAN
            lean.stage = UPDATED
        except Exception as exc:
            self._guard.fail(Feature.STEP, exc)
        return False

    def _rest_allow(self, rec: StepRecord) -> None:
        """After ``rec`` ended in full: may the next ordinary steps rest, and on what."""
        gate = self._gate
        gate.ok = REST_NEVER
        kind = self._rest_kind(rec)
        if not kind or self._base_micro != rec.micro or self._base_samples is None or self._counter.active:
            return
        blocks = rec.blocks
        if blocks > 1 and self._base_samples % blocks:
            return  # (blocks of unlike samples: each resting block is told its share)
        sums = self._sums
        base_grads = self._base_grads_begin
        if base_grads not in (0, sums.gradients):
            return  # (not a figure a resting step can start from)
        throughput = self._throughput
        gate.until = self._quiet_until
        ref = self._probe_ref
        gate.probe = ref if ref is not None else no_parameter
        witness = self._witness_ref
        gate.witness = witness if witness is not None else no_parameter
        gate.probe_data = self._probe_data if self._probe_data is not None else -1
        gate.blocks, gate.micro = blocks, rec.micro // blocks
        gate.block_samples = self._base_samples // blocks
        # (the tracker's default is a step's: under accumulation in blocks, each is told its own)
        gate.default_samples = throughput.default_samples if blocks == 1 else None
        gate.need_tokens = bool(kind & NEED_TOKENS)
        gate.grads = ANY_GRAD if sums.gradients == 0 else int(base_grads != 0)
        gate.start_grads, gate.opt_states = base_grads, sums.optimizer_states
        watch = self._model_watch
        gate.regs = watch.registrations if watch.registrations is not None else {}
        gate.key = watch.key
        self._lean.resting = self._lean_other.resting = False  # (primed anew: the sums may have moved)
        gate.ok = kind

    def _rest_kind(self, rec: StepRecord) -> int:
        """May the next ordinary steps run with every hook of ours off, after ``rec`` ended in full?
        In a loop that marks its steps and whose tracked optimizer's hooks mark the update (on CUDA
        between the steps the device times, which are watched: anatomy.hook.ordinary's DEVICE_EVERY_S),
        nothing compiled, no framework marking the forward, and ``rec`` the usual step: its forwards
        watched, as many in each of its blocks (gradient accumulation: one block, or one a micro-batch), one
        update, in its last block, no closure. A resting step's samples and tokens come from the step or the
        tracker's defaults, never from the batch (a batch of another shape would go unseen): the step must
        be given what no default names — its tokens too, unless ``rec``'s batch had none (floats, or one
        dimension: none whatever its shape)."""
        if not (self._plain_ok and self._explicit and self._opt_handles and self._handles) or self._no_rest:
            return REST_NEVER
        if self._compile_safe or not REST_ON or self._closed:
            return REST_NEVER
        if self._compiled():  # (compiled in this step: the next step's begin looks, its hooks wrapped)
            return REST_NEVER
        if rec.micro < 1 or rec.micro % rec.blocks or rec.suspended or not rec.updated or rec.closure:
            return REST_NEVER  # (each block its forwards, the update in the last: gradient accumulation)
        if not any(kind == FORWARD_PRE for kind, _ in rec.clock.marks):
            return REST_NEVER  # (its forward went unwatched and it did not end as usual: the next one looks)
        # A resting step's update is seen by one version counter alone (the witness's): one optimizer, whose
        # update moved it on this step.
        probe = self._probe_ref() if self._probe_ref is not None else None
        if probe is None or rec.version < 0 or self._extra_optimizers:
            return REST_NEVER
        witness = self._witness_ref() if self._witness_ref is not None else None
        if witness is None or witness._version == rec.version:
            self._learn_witness(probe, witness)
            return REST_NEVER
        throughput = self._throughput
        rest = REST
        if throughput.default_samples is None:
            rest |= NEED_SAMPLES
        no_tokens = rec.tokens is None and rec.samples_seen > 0 and rec.tokens_seen == 0
        if throughput.default_tokens is None and not no_tokens:
            rest |= NEED_TOKENS
        return rest

    def _learn_witness(self, probe: torch.Tensor, witness: torch.Tensor | StepCount | None) -> None:
        """An update that moved no version the next steps would read. A fused optimizer's kernel (torch's
        ``fused=True`` Adam and AdamW, the Trainer's default) writes the parameters without moving their
        version counters: the next look reads the probe's step count in the optimizer's state instead, which
        the optimizer moves in place as it steps. A step count that did not move on this step (a sampled
        step: a foreach op under a dispatch mode moves no version either) stays the witness while the
        optimizer holds it; one the optimizer no longer holds (an optimizer made anew) gives way to the new
        one's. A step count kept as a Python int (bitsandbytes' optimizers: ``p.data`` written on the CPU,
        a kernel called by pointer on CUDA) is read through
        :class:`~anatomy.hook.rest_gate.StepCount`. No step count: the probe's version again (where nothing
        moves, no step rests, as before)."""
        optimizer = self._optimizer
        state = getattr(optimizer, "state", None)
        entry = state.get(probe) if isinstance(state, Mapping) else None
        count = entry.get("step") if isinstance(entry, Mapping) else None
        if isinstance(count, torch.Tensor):
            if count is not witness:
                self._witness_ref = weakref.ref(count)
        elif type(count) is int:  # (bitsandbytes': a Python int, moved as it steps)
            if not (isinstance(witness, StepCount) and witness.counts(optimizer, probe)):
                self._witness_ref = StepCount(optimizer, probe)
        else:
            self._witness_ref = self._probe_ref

    def _hooks_off(self) -> None:
        """Our hooks rest: the model's forward hooks and the optimizer's (torch's module call and optimizer
        step take their fast paths again), the optimizer watch's global one out of torch's dict."""
        for handle in self._handles:
            handle.remove()
        for handle in self._opt_handles:
            handle.remove()
        self._opt_handles = []
        self._optimizer_watch.pause()
        self._resting = True

    def _hooks_on(self) -> None:
        """Our hooks back, for a step watched in full (or the rest of one that stopped being ordinary). The
        rest gate stays as it was (the same hooks back, nothing of the model changed; a step that closes it
        closes it itself), unless something is compiled now."""
        rest = self._gate.ok
        self._optimizer_watch.resume()
        with self._guard(Feature.OPTIMIZER):
            if self._optimizer is not None:
                self._register_optimizer_hooks()
        with self._guard(Feature.FORWARD):
            self._register_model_hooks()
        if not self._compile_safe and self._guard.ok(Feature.FORWARD):
            self._gate.ok = rest
