"""What a training framework tells the tracker beside the model's and the optimizer's own hooks: its
forward's start and end (Lightning's ``training_step``, from the batch's start to its loss's backward)
and a backward's end. (A closure's start and return come from the closure the optimizer hook wraps:
:mod:`anatomy.hook.phases`.)

Lightning's automatic optimization is an ordinary step too, on the :class:`~anatomy.hook.lean.LeanStep`:
its forward opens at ``forward_begin`` (``framework``: the model's own forward hooks nest inside it, and
count once), the optimizer's step gets a closure (wrapped as the full way wraps it) that runs
``training_step`` and the backward, ``backward_begin`` ends the forward, ``backward_end`` the backward, the
closure's return begins the optimizer phase. What else happens (a second forward, the closure called
again, a forward after the optimizer's step) makes the step a record, as in the model's own hooks.

A framework whose step block begins with :meth:`FrameworkCalls.batch_begins` rests as README's loop does:
the block's samples and tokens come from its batch (the first tensor), so where the batch has the shape of
the last build's, the step runs under no hook of ours (:mod:`anatomy.hook.resting`) and the framework
leaves its own calls out of it until ``end_step`` — what it would time, the last build's split scaled to
the step shows. Its calls inside a watched step then leave the gate as it is (a look's end says again);
only one outside a watched step closes it. A framework that never says so marks every forward: its steps
never rest.

A layer of :class:`~anatomy.hook.tracker.Tracker` (see :mod:`anatomy.hook.tracker_state`), above the phase
hooks (:mod:`anatomy.hook.phases`).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import torch

from anatomy.hook.guard import Feature
from anatomy.hook.held import Held
from anatomy.hook.lean import BEGUN, FORWARD_DONE, IN_FORWARD
from anatomy.hook.phases import PhaseHooks
from anatomy.hook.timing import BACKWARD_END
from anatomy.vocabulary import Phase


class FrameworkCalls(PhaseHooks):
    """A framework's calls at the boundaries of a step."""

    def batch_begins(self, batch: Any = None) -> bool:
        """A framework's step block begins on ``batch`` (its first tensor; None: none). Its samples and
        tokens are told as the model's forward hook would count them: the first dimension, and for a batch
        of integers of two dimensions or more all its elements. True: the step rests — the framework makes
        none of its calls (``forward_begin`` …) until ``end_step``; False: ``forward_begin(batch)`` next."""
        self._framework_rests = True
        samples = tokens = None
        shape = None
        if isinstance(batch, torch.Tensor) and batch.dim() >= 1:
            shape = batch.shape
            samples = int(shape[0])
            if batch.dim() >= 2 and not batch.is_floating_point():
                tokens = int(batch.numel())
        if shape != self._lean.shape:  # (another shape than the last build's: this step watches)
            self._gate.close()
        self.begin_step(samples, tokens)
        lean = self._lean
        return lean.active and lean.resting

    def _framework_call(self) -> None:
        """A framework's forward or backward call: a step it marks is watched."""
        if not self._framework_rests:
            self._no_rest = True  # the framework's forward marks are the step's: the hooks watch every one
            self._gate.close()
            return
        lean = self._lean
        if not ((lean.active and not lean.resting) or self._step is not None):
            self._gate.close()  # (outside a watched step: the next step looks)

    def forward_begin(self, batch: Any = None) -> None:
        """A framework's training forward starts — Lightning's ``training_step``, which may call any of
        the model's submodules (``self.model(...)``) rather than the model's own forward. The model's
        forward hooks inside it nest and are not counted twice. ``batch``: its first tensor gives the
        micro-batch's size."""
        self._framework_call()
        lean = self._lean
        unseen = lean.forward_pre != lean.forward_pre  # (NaN: a resting step's forward, no framework's)
        if lean.active and lean.resting and lean.stage == FORWARD_DONE and unseen:
            lean.stage = BEGUN  # (a resting step: this forward is its first, the framework's marks time it)
        if lean.active and lean.stage != BEGUN:
            self._promote()
        if not self.enabled or (self._step is None and not lean.active):
            return
        args = (batch,) if isinstance(batch, torch.Tensor) else ()
        self._on_forward_pre(self.model, args, {})
        if lean.active and lean.stage == IN_FORWARD:  # (the usual forward, begun by the framework)
            lean.framework = True

    def forward_end(self) -> None:
        """The framework's forward is done (its loss exists; Lightning's ``on_before_backward``)."""
        lean = self._lean
        if lean.active:
            if lean.stage != IN_FORWARD:
                return  # (no forward open: nothing to end)
            lean.framework = False  # (the forward's end below is the usual one)
            lean.depth = 0
            self._on_forward_post(self.model, (), None)
            return
        rec = self._step
        if not self.enabled or rec is None or rec.in_forward != 1:
            return
        self._on_forward_post(self.model, (), None)

    def backward_begin(self) -> None:
        """The framework's loss goes to backward (Lightning's ``on_before_backward``): its forward is done,
        also a later one of the same step that began after an optimizer step (manual optimization)."""
        self._framework_call()
        lean = self._lean
        if lean.active and lean.stage >= FORWARD_DONE:  # (a later forward, or a second backward)
            self._promote()
        rec = self._step
        later = rec is not None and not rec.in_forward and rec.optimizer_ran and not rec.in_optimizer
        if self.enabled and later and rec is not None:
            with self._guard(Feature.TIMING):
                rec.clock.later_forward()
        self.forward_end()

    def backward_end(self) -> None:
        """A micro-batch's backward is done (the Trainer's ``on_substep_end``): its gradients exist."""
        lean = self._lean
        if lean.active:
            if lean.stage == FORWARD_DONE and not lean.backward_ended:
                lean.backward_ended = perf_counter()
                if lean.clock is not None:
                    lean.clock.mark(BACKWARD_END)
                return
            self._promote()
        rec = self._step
        if not self.enabled or rec is None or rec.in_forward or rec.suspended:
            return
        if rec.window or self._counter.active:
            self._close_window(rec)
        try:
            clock = rec.clock
            if clock.cuda:
                if Feature.TIMING not in self._guard.off:
                    clock.mark(BACKWARD_END)
            elif Feature.TIMING not in self._guard.off:
                clock.marks.append((BACKWARD_END, perf_counter()))  # (StepClock.mark, written out)
            memory = self._memory
            if memory is not None and rec.heap_on:
                grads = self._sums.gradients
                held = Held(gradients=max(grads, rec.grads_begin), optimizer_states=rec.opt_begin)
                memory.read(rec, Phase.BACKWARD, max(grads - rec.grads_begin, 0), held)
        except Exception as exc:
            self._guard.fail(Feature.BACKWARD, exc)
