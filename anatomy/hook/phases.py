"""The tracker's phase hooks: what happens at each boundary inside a step — the forward's start and end,
a backward's end, the optimizer's step (with or without a closure). An ordinary step's path through
each moves its :class:`~anatomy.hook.lean.LeanStep` on a stage and reads the clock, nothing else; what
the usual step does not do makes it a record (``StepRecord.plain`` while it measures nothing).

A layer of :class:`~anatomy.hook.tracker.Tracker` (see :mod:`anatomy.hook.tracker_state`). The hooks
run on every step: each is one guarded section (the guard's contract) and spares every call it can.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from time import perf_counter
from typing import Any

import torch

from anatomy.hook.detect import active_autocast_dtype
from anatomy.hook.guard import Feature
from anatomy.hook.held import Held
from anatomy.hook.hello import target_shape
from anatomy.hook.lean import BEGUN, FORWARD_DONE, IN_FORWARD, IN_OPTIMIZER, UPDATED
from anatomy.hook.record import StepRecord
from anatomy.hook.saved_values import input_storage_keys
from anatomy.hook.split import explained_after_optimizer, held_after_optimizer
from anatomy.hook.step_context import wrap_closure
from anatomy.hook.timing import FORWARD_POST, FORWARD_PRE, OPTIMIZER_POST, OPTIMIZER_PRE
from anatomy.hook.window import CountingWindow
from anatomy.vocabulary import Phase

log = logging.getLogger("anatomy")
UNSEEN_UPDATES_WARNING = 3  # updates without any step seen before the tracker says so, once


# The batch tensor's usual keyword names, in the order they are looked for.
BATCH_KEYS = ("input_ids", "inputs_embeds", "pixel_values", "input_values", "input_features", "x", "input")


def keyword_batch(kwargs: Any) -> torch.Tensor | None:
    """The batch tensor among a forward's keyword arguments: the first of ``BATCH_KEYS`` that holds a tensor
    (None: ``kwargs`` is no mapping, or none does). The forward hook runs this rule written out."""
    if not isinstance(kwargs, Mapping):
        return None
    for key in BATCH_KEYS:
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor):
            return value
    return None


class PhaseHooks(CountingWindow):
    """The boundaries inside a step (the sampled step's instruments below them)."""

    # -- hooks -------------------------------------------------------------------------------------

    def _on_forward_pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        count = reached = False
        rec = None
        lean = self._lean
        try:
            if not lean.active and self._step is None:
                if self._explicit or self._closed or not (torch.is_grad_enabled() and module.training):
                    return
                self._begin(auto=True)
                lean = self._lean
            x = None  # the batch tensor (keyword_batch, then the first positional tensor, written out)
            if kwargs:
                for key in BATCH_KEYS:
                    value = kwargs.get(key)
                    if isinstance(value, torch.Tensor):
                        x = value
                        break
            if x is None:
                for value in args:
                    if isinstance(value, torch.Tensor):
                        x = value
                        break
            if lean.active:
                if not torch.is_grad_enabled():
                    return  # (a forward outside the step's graph)
                if lean.framework and lean.stage == IN_FORWARD:
                    lean.depth += 1  # (the model's own forward, inside the framework's: counted once)
                    return
                if lean.stage == BEGUN and x is not None and x.shape == lean.shape:
                    # The usual step's forward on the batch shape counted last: nothing is due.
                    regs = self._model_watch.registrations
                    if regs is not None:
                        regs.pop(self._model_watch.key, None)  # (ModelWatch.pause, written out)
                    if lean.samples is None or lean.tokens is None:
                        lean.samples_seen = lean.shape_samples
                        tokens = lean.shape_tokens
                        lean.tokens_seen = tokens if tokens and not x.is_floating_point() else 0
                    else:
                        lean.samples_seen = lean.tokens_seen = 0
                    lean.stage = IN_FORWARD
                    lean.forward_pre = perf_counter()
                    if lean.clock is not None:
                        lean.clock.mark(FORWARD_PRE)
                    return
                rec = self._promote()
            else:
                rec = self._step
                if rec is None:
                    return
            if not torch.is_grad_enabled() or rec.suspended:  # (between step blocks: not the step's)
                return
            rec.in_forward += 1
            if rec.in_forward > 1:
                return  # re-entrant call of the same model inside its forward
            # Modules registered inside the forward (Hugging Face slices its layer list into a new
            # ModuleList every forward: one registration per layer) are not the model changing: the watch
            # for them rests until the forward returns, so it costs nothing per layer.
            regs = self._model_watch.registrations
            if regs is not None:
                regs.pop(self._model_watch.key, None)  # (ModelWatch.pause, written out)
            if not rec.recall:
                rec.micro += 1
            if rec.window or self._counter.active:
                self._close_window(rec)  # an earlier micro-batch's, left open after its forward
            off = self._guard.off
            shape = x.shape if x is not None else None
            if shape is not None and self._batch_shape is None:
                # once: a shape that varies per step must not resend the hello
                self._batch_shape = tuple(shape)
                self._target_shape = target_shape(kwargs)
                self._hello_changed()
            if x is not None and (rec.samples is None or rec.tokens is None) and x.dim() >= 1:
                rec.samples_seen += int(shape[0])  # type: ignore[index]
                if x.dim() >= 2 and not x.is_floating_point():
                    rec.tokens_seen += int(x.numel())
            sched = self._schedule
            if Feature.ACTIVATIONS not in off:
                if not rec.quiet or rec.counting or shape != sched.input_shape:
                    seen = None if shape is None else tuple(shape)
                    rec.counting = sched.count_due(rec.index, seen, rec.counting)
                count = rec.counting or rec.trace is not None
            if count or rec.heap_on:  # autocast is looked for on the steps that measure (~10 µs cold)
                rec.plain = False
                ac = active_autocast_dtype(self._device.type if self._device is not None else "cpu")
                if ac is not None and ac != self._autocast_dtype:
                    self._autocast_dtype = ac
                    self._hello_changed()  # the precision is mixed now
            memory = self._memory
            if not rec.heap_on and rec.micro == 1 and (count or shape != sched.input_shape):
                # A new shape (or a count due): read this step's heap after all, from here (nothing
                # of the step has been allocated yet).
                rec.heap_on = True
                rec.plain = False
                if memory is not None:
                    memory.read_start(rec)
            if rec.trace is not None or (memory is not None and memory.is_cuda):
                self._boundary(rec, Phase.FORWARD)
            clock = rec.clock
            if clock.cuda:
                if Feature.TIMING not in off:
                    clock.mark(FORWARD_PRE)
            elif Feature.TIMING not in off:
                clock.marks.append((FORWARD_PRE, perf_counter()))  # (StepClock.mark on the host, written out)
            reached = True
        except Exception as exc:
            self._guard.fail(Feature.FORWARD, exc)
        if count and reached and rec is not None:
            # (fails where saved-tensor hooks are disabled, e.g. by a compiler or FSDP)
            with self._guard(Feature.ACTIVATIONS):
                counter = self._counter
                counter.reset()
                counter.set_inputs(input_storage_keys(args, kwargs))
                rec.window = counter.start(keep_open=True)
        if reached and rec is not None and rec.piece is not None:  # a sampled step's piece may begin here
            with self._guard(Feature.OP_GROUPS if rec.profiler is not None else Feature.HEAP_TRACE):
                rec.piece.model_begins()

    def _on_forward_post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        lean = self._lean
        if lean.active:
            if lean.stage == IN_FORWARD:
                if lean.depth:  # (a forward nested in the framework's ends)
                    lean.depth -= 1
                    return
                lean.framework = False
                lean.stage = FORWARD_DONE
                watch = self._model_watch
                if watch.registrations is not None and not watch.closed:
                    watch.registrations[watch.key] = watch.hook  # (ModelWatch.resume, written out)
                lean.forward_post = perf_counter()
                if lean.clock is not None:
                    lean.clock.mark(FORWARD_POST)
            return  # (otherwise not in the forward)
        try:
            rec = self._step
            if rec is None or rec.in_forward == 0:
                return
            rec.in_forward -= 1
            if rec.in_forward > 0:
                return
            if rec.piece is not None:  # a sampled step's piece may end here (its backward hooked)
                rec.piece.model_ends(output)
            watch = self._model_watch
            if watch.registrations is not None and not watch.closed:
                watch.registrations[watch.key] = watch.hook  # (ModelWatch.resume, written out)
            counter = self._counter
            sums = self._sums
            if rec.window:  # what the forward saved (the window may stay open for the loss)
                with self._guard(Feature.ACTIVATIONS):
                    counter.observe_reentrant_states(output)  # what reentrant checkpoints keep on their nodes
                acts = counter.activation_bytes
                copies = counter.weight_copy_bytes
                with self._guard(Feature.ACTIVATIONS):
                    self._record_unsharded(rec)
                    counter.end_forward()
                if not counter.active:
                    self._record_count(rec)
            else:  # not counted this time: the last count stands
                acts, copies = sums.activations or 0, sums.weight_copies
            clock = rec.clock
            if clock.cuda:
                if Feature.TIMING not in self._guard.off:
                    clock.mark(FORWARD_POST)
            elif Feature.TIMING not in self._guard.off:
                clock.marks.append((FORWARD_POST, perf_counter()))  # (StepClock.mark, written out)
            memory = self._memory
            if memory is None:
                return
            if rec.heap_on:  # (only a step that reads the heap reads at a boundary)
                earlier_grads = max(sums.gradients - rec.grads_begin, 0) if rec.micro > 1 else 0
                held = Held(acts, copies, rec.grads_begin + earlier_grads, rec.opt_begin)
                memory.read(rec, Phase.FORWARD, acts + copies + earlier_grads, held)
            if rec.trace is not None or memory.is_cuda:
                self._boundary(rec, Phase.BACKWARD)
        except Exception as exc:
            self._guard.fail(Feature.FORWARD, exc)

    def _on_optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """An optimizer step begins. With a closure (LBFGS, Lightning), forward and backward run inside
        the step: the optimizer phase begins when the closure returns, so the closure is wrapped — the
        wrapper calls the user's closure once per call, returns what it returns and lets its exceptions
        through unchanged."""
        lean = self._lean
        if lean.active:
            closure = kwargs.get("closure") if kwargs else None
            if closure is None and len(args) > 1:
                closure = args[1]
            if closure is None:  # (accelerate passes ``closure=None`` on)
                if lean.stage == FORWARD_DONE and lean.index != self._forced_refresh:
                    lean.stage = IN_OPTIMIZER  # the usual step's optimizer phase begins
                    lean.optimizer_pre = perf_counter()
                    if lean.clock is not None:
                        lean.clock.mark(OPTIMIZER_PRE)
                    return None
                if lean.stage == IN_OPTIMIZER:
                    return None  # (begun already, by a framework's callback)
            elif lean.framework and lean.stage == IN_FORWARD and not lean.closure:
                # Lightning's automatic optimization: the framework's forward runs in the closure
                wrapped = None
                with self._guard(Feature.OPTIMIZER):
                    wrapped = wrap_closure(self, args, kwargs)
                if wrapped is not None:
                    lean.closure = True
                    return wrapped
            elif lean.resting:
                lean.stage = BEGUN  # (an unwatched step's forward is the closure's, to come)
            self._promote()
        wrapped = None
        if kwargs or len(args) > 1:  # (a plain ``step()`` gets only the optimizer: nothing to look at)
            with self._guard(Feature.OPTIMIZER):
                wrapped = wrap_closure(self, args, kwargs)
            if wrapped is not None:
                if self._step is not None and not self._step.micro:  # (Lightning's began before it)
                    self._step.closure = True
                return wrapped
        try:
            rec = self._step
            if rec is None or rec.in_optimizer or rec.in_forward:
                return None  # (optimizer_begin would do nothing: no step, or already begun by a callback)
            plain = rec.plain and not rec.optimizer_ran and not rec.window and not self._counter.active
            if plain and rec.index != self._forced_refresh:
                # An ordinary step's optimizer phase begins (optimizer_begin's path for it, written out).
                rec.optimizer_ran = rec.in_optimizer = True
                rec.grads = self._sums.gradients
                if Feature.TIMING not in self._guard.off:
                    rec.clock.marks.append((OPTIMIZER_PRE, perf_counter()))
                return None
        except Exception as exc:
            self._guard.fail(Feature.OPTIMIZER, exc)
            return None
        self.optimizer_begin()
        return None

    def _on_optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        lean = self._lean
        if lean.active:
            if lean.stage == IN_OPTIMIZER:
                lean.stage = UPDATED
                lean.optimizer_post = perf_counter()
                if lean.clock is not None:
                    lean.clock.mark(OPTIMIZER_POST)
                if lean.auto:
                    self.end_step()
                return
            self._promote()
        rec = self._step
        if rec is None and not self._explicit and not self._closed:
            self._unseen_updates += 1
            if self._unseen_updates == UNSEEN_UPDATES_WARNING:
                log.warning(
                    "anatomy: %d optimizer updates and no training-mode forward of the tracked %s: nothing "
                    "is measured. Track the module whose forward the loop calls, mark steps with "
                    "tracker.step(), or with PyTorch Lightning use anatomy.lightning.AnatomyCallback.",
                    self._unseen_updates,
                    type(self.model).__name__,
                )
        if rec is None:
            return
        rec.updated = True  # the hook fires only when the step ran (not on a skipped fp16 step)
        rec.recall = False
        if rec.plain and rec.in_optimizer and rec.opt_after is None:
            try:  # an ordinary step's optimizer phase ends (optimizer_end's path for it, written out)
                rec.in_optimizer = False
                if Feature.TIMING not in self._guard.off:
                    rec.clock.marks.append((OPTIMIZER_POST, perf_counter()))
                rec.opt_after = self._sums.optimizer_states
            except Exception as exc:
                self._guard.fail(Feature.OPTIMIZER, exc)
            if rec.auto:
                self.end_step()
            return
        self.optimizer_end()

    def closure_begin(self) -> None:
        """A closure passed to the optimizer's step starts (its forward). Called again inside the same
        optimizer step (LBFGS re-evaluates), the optimizer phase pauses for it."""
        lean = self._lean
        if lean.active:
            if lean.closure and lean.stage == IN_FORWARD:
                return  # (the closure the usual framework step wrapped, called once, in its forward)
            self._promote()
        rec = self._step
        if not self.enabled or rec is None or not rec.in_optimizer:
            return
        with self._guard(Feature.OPTIMIZER):
            rec.in_optimizer = False
            rec.recall = True

    def closure_end(self) -> None:
        """The closure returned: this step's gradients are complete, the optimizer's math begins."""
        self.optimizer_begin()

    def optimizer_begin(self) -> None:
        """Gradients are complete: measure them, and start the optimizer phase. Called by the
        optimizer's step pre-hook; the Trainer callback calls it too (a second call is ignored)."""
        lean = self._lean
        if lean.active:
            if lean.stage == FORWARD_DONE and lean.index != self._forced_refresh:
                lean.stage = IN_OPTIMIZER  # the usual step's optimizer phase begins
                lean.optimizer_pre = perf_counter()
                if lean.clock is not None:
                    lean.clock.mark(OPTIMIZER_PRE)
                return
            if lean.stage == IN_OPTIMIZER:
                return
            self._promote()
        rec = self._step
        if not self.enabled or rec is None or rec.in_optimizer or rec.in_forward:
            return
        plain = rec.plain and not rec.optimizer_ran and not rec.window and not self._counter.active
        if plain and rec.index != self._forced_refresh:  # an ordinary step: nothing measured here
            rec.optimizer_ran = rec.in_optimizer = True
            rec.grads = self._sums.gradients
            if Feature.TIMING not in self._guard.off:
                rec.clock.marks.append((OPTIMIZER_PRE, perf_counter()))
            return
        if rec.optimizer_ran:  # a second optimizer (a GAN's), or a closure's re-evaluation done
            rec.in_optimizer = True
            if self._guard.ok(Feature.TIMING):
                rec.clock.mark(OPTIMIZER_PRE)
            # Under ZeRO this is the Trainer's on_pre_optimizer_step after the engine's update (inside its
            # backward): DeepSpeed's buffers are empty now and param.grad never set — the gradients measured
            # as its step began stand (re-summing here left 0 as the figure of later, unmeasured steps).
            refresh = rec.grads is not None and self._zero_ref is None and self._refreshes(rec)
            if refresh and self._guard.ok(Feature.GRADIENTS):
                with self._guard(Feature.GRADIENTS):  # gradients at their largest over the step's updates
                    # (ZeRO's own buffers too: param.grad alone would make the standing figure 0 there)
                    rec.grads = self._sums.gradients = max(rec.grads or 0, self._gradient_bytes())
            return
        if rec.window or self._counter.active:
            self._close_window(rec)
        off = self._guard.off
        try:
            rec.optimizer_ran = rec.in_optimizer = True
            sums = self._sums
            if rec.grads is None and Feature.GRADIENTS not in off and self._refreshes(rec):
                with self._guard(Feature.GRADIENTS):
                    sums.gradients = self._gradient_bytes()
            rec.grads = sums.gradients
            memory = self._memory
            if memory is not None:
                if rec.heap_on:
                    held = Held(gradients=rec.grads, optimizer_states=rec.opt_begin)
                    memory.read(rec, Phase.BACKWARD, max(rec.grads - rec.grads_begin, 0), held)
                if rec.trace is not None or memory.is_cuda:
                    self._boundary(rec, Phase.OPTIMIZER)
            if Feature.TIMING not in off:
                rec.clock.mark(OPTIMIZER_PRE)
            if rec.profiler is not None:
                rec.profiler.set_phase(Phase.OPTIMIZER)
            if rec.piece is not None:
                rec.piece.optimizer_begins()
        except Exception as exc:
            self._guard.fail(Feature.OPTIMIZER, exc)

    def optimizer_end(self) -> None:
        """The optimizer step is done: its states exist now. Ends an automatic step."""
        lean = self._lean
        if lean.active:
            if lean.stage == UPDATED:
                return  # (ended already, by the optimizer's own hook)
            if lean.resting and lean.stage == IN_OPTIMIZER:  # (no optimizer hook: the step's end says
                lean.optimizer_post = perf_counter()  # whether it updated, by the probe's version)
                return
            self._promote()
        rec = self._step
        if not self.enabled or rec is None or not rec.in_optimizer:
            return
        rec.in_optimizer = False
        if rec.piece is not None:
            rec.piece.optimizer_ends()
        if rec.opt_after is not None:  # a second optimizer's step: its time, and its states on refresh
            if self._guard.ok(Feature.TIMING):
                rec.clock.mark(OPTIMIZER_POST)
            if self._refreshes(rec) and self._guard.ok(Feature.OPTIMIZER_STATES):
                with self._guard(Feature.OPTIMIZER_STATES):
                    rec.opt_after = self._sums.optimizer_states = self._sum_optimizer_states()
            return
        off = self._guard.off
        try:
            if Feature.TIMING not in off:
                rec.clock.mark(OPTIMIZER_POST)
            refresh = rec.refresh or rec.index == self._forced_refresh
            if refresh and Feature.OPTIMIZER_STATES not in off and self._optimizer is not None:
                with self._guard(Feature.OPTIMIZER_STATES):
                    self._sums.optimizer_states = self._sum_optimizer_states()
            rec.opt_after = self._sums.optimizer_states
            memory = self._memory
            if refresh and memory is not None:  # in steady state the heap after the step equals before
                held = held_after_optimizer(rec, self._sums)
                memory.read(rec, Phase.OPTIMIZER, explained_after_optimizer(rec), held)
            if rec.trace is not None or (memory is not None and memory.is_cuda):
                self._boundary(rec, Phase.OTHER)
        except Exception as exc:
            self._guard.fail(Feature.OPTIMIZER, exc)
        if rec.auto and rec.updated:
            self.end_step()

    def _boundary(self, rec: StepRecord, next_phase: Phase) -> None:
        """A phase ends and ``next_phase`` begins: tell the sampled step's trace, and close the
        allocator's peak window (CUDA)."""
        if rec.trace is not None:
            rec.trace.phase = next_phase
            if rec.grad_watch is not None:
                rec.grad_watch.phase_begins(next_phase)
        if self._memory is not None:
            self._memory.phase_ends(rec, next_phase)
