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

    def forward_begin(self, batch: Any = None) -> None:
        """A framework's training forward starts — Lightning's ``training_step``, which may call any of
        the model's submodules (``self.model(...)``) rather than the model's own forward. The model's
        forward hooks inside it nest and are not counted twice. ``batch``: its first tensor gives the
        micro-batch's size."""
        self._no_rest = True  # the framework's forward marks are the step's: the hooks watch every one
        self._gate.close()
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
        self._no_rest = True
        self._gate.close()
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
