"""The Hugging Face Trainer way in: ``Trainer(..., callbacks=[anatomy.AnatomyCallback()])``.

The callback finds the model and the optimizer itself (the torch optimizer inside accelerate's
wrapper), and maps the Trainer's events onto the tracker: a step from ``on_step_begin`` to
``on_step_end``; gradients measured at ``on_pre_optimizer_step`` (after clipping) and optimizer
states at ``on_optimizer_step`` — the optimizer's own step hooks fire there too, whichever comes
first counts.

A step begins on its batch (:meth:`Tracker.batch_begins`), as Lightning's do: the Trainer's events carry no
batch, so the callback wraps its Trainer's ``training_step`` and the step begins there, told the samples and
tokens of the batch's ``input_ids`` (or another of the keys the model's forward hook reads first). Under
gradient accumulation each micro-batch is a block of its step, begun so in ``training_step`` and ended at
``on_substep_end`` (the last one at ``on_step_end``): a block without an update is a micro-batch of the step
that updates. An ordinary step then rests as README's loop does — no hook of ours on the model or the
optimizer, and none of the callback's calls but the blocks' ends until ``on_step_end``. A batch that is no
mapping, or has none of those keys, is not told: its step (or block) begins as it is and is watched, its
samples counted by the model's forward hook; a Trainer that never calls ``training_step`` has its steps
begin at ``on_step_begin`` (micro-batches told apart by the forward hooks, ``on_substep_end`` closing each
one's backward).

A Trainer reports no exceptions to callbacks, so to write the out-of-memory file the callback wraps
its Trainer's ``train`` (found at ``on_init_end``; or ``training_step`` when the callback was added
later). The exception itself always propagates unchanged.

At each logging step the anatomy joins the Trainer's own logs (``anatomy/...``, see
:mod:`anatomy.hook.trainer_logs`), so ``report_to``'s loggers receive it; ``log=False`` turns that off.
"""

from __future__ import annotations

import functools
import sys
from types import FrameType
from typing import Any

import torch
from transformers import TrainerCallback

from anatomy.hook import trainer_logs
from anatomy.hook.callback_base import CallbackBase
from anatomy.hook.detect import detect_precision
from anatomy.hook.phases import keyword_batch
from anatomy.hook.tensors import dominant_dtype
from anatomy.hook.tracker import Tracker, hook_disabled

_WRAPPED = "_anatomy_wrapped"
_TELLS = "_anatomy_tells"  # (a training_step wrapper that begins the callback's steps on their batch)
# Where a Trainer step is: between steps; begun by on_step_begin, its batch still to come (training_step);
# begun on its batch and watched (our calls made); begun on its batch and resting (none made).
OUTSIDE, PENDING, WATCHED, RESTING = 0, 1, 2, 3


def _find_trainer(max_depth: int = 10) -> Any:
    """The Trainer whose event is being delivered: the nearest caller frame whose ``self`` is one."""
    try:
        from transformers import Trainer
    except Exception:
        return None
    frame: FrameType | None = sys._getframe(1)
    for _ in range(max_depth):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


def _register_other_models(tracker: Tracker, trainer: Any, model: Any) -> None:
    """Every other module the Trainer holds with weights of its own (TRL's ``ref_model``, a subclass's
    ``teacher``) is a model the step runs: named, so that its weights are not runtime or unattributed.
    The trained model and its wrappers (``model_wrapped``: DDP, DeepSpeed's engine) are not."""
    own = {id(model), id(getattr(trainer, "model", None)), id(getattr(trainer, "model_wrapped", None))}
    for name, value in list(vars(trainer).items()):
        if (
            not isinstance(value, torch.nn.Module)
            or id(value) in own
            or getattr(value, "module", None) is model
        ):
            continue
        if next(value.parameters(), None) is None and next(value.buffers(), None) is None:
            continue  # a loss module, a metric: no weights
        tracker.add_model(name, value)


class AnatomyCallback(CallbackBase, TrainerCallback):
    """Measures every optimizer step of a Trainer run and publishes it to anatomy-top.

    Keyword settings (``publish``, ``interval_s``, ``sample_every``, ``directory``, ``log``, ``record``):
    :class:`anatomy.hook.callback_base.CallbackBase`."""

    framework = "Trainer"
    _wrapped_train = False  # set per instance once its Trainer's ``train`` is wrapped
    _tells = False  # set per instance: its steps begin on their batch, in the Trainer's ``training_step``
    _in_step = OUTSIDE  # set per instance: where the step is (OUTSIDE, PENDING, WATCHED, RESTING)

    # -- finding the pieces -----------------------------------------------------------------------

    def _wrap(self, trainer: Any, name: str) -> bool:
        original = getattr(trainer, name, None)
        if original is None or getattr(original, _WRAPPED, False):
            return False
        callback = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                callback._record_failure(exc, close=name == "train")
                raise

        setattr(wrapper, _WRAPPED, True)
        setattr(trainer, name, wrapper)
        return True

    # -- events -----------------------------------------------------------------------------------

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if hook_disabled():
            return

        def find() -> None:
            trainer = _find_trainer()
            if trainer is not None:
                self._wrapped_train = self._wrap(trainer, "train") or self._wrapped_train

        self._guard("on_init_end", find)

    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None, **kwargs: Any
    ) -> None:
        self._guard("on_train_begin", self._start, args, model, optimizer)
        if self.log_to_loggers and self.tracker is not None and not hook_disabled():
            self._guard("on_train_begin", self._install_logs)

    def _install_logs(self) -> None:
        trainer = _find_trainer()
        if trainer is not None:
            trainer_logs.install(trainer.callback_handler, self, self._latest)

    def _start(self, args: Any, model: Any, optimizer: Any) -> None:
        if model is None:
            return
        tracker = self._current_tracker(model)
        if tracker is None:
            tracker = self._track(
                model, optimizer, grad_accum_steps=int(getattr(args, "gradient_accumulation_steps", 1) or 1)
            )
        else:
            tracker.attach_optimizer(optimizer)
        autocast = None
        if getattr(args, "bf16", False):
            autocast = torch.bfloat16
        elif getattr(args, "fp16", False):
            autocast = torch.float16
        if autocast is not None:
            precision = detect_precision(param_dtype=dominant_dtype(model), autocast_dtype=autocast)
            tracker.set_precision(precision, grad_scaler=autocast == torch.float16)
        trainer = _find_trainer() if not hook_disabled() else None
        self._tells = False
        if trainer is not None:
            self._tells = self._wrap_training_step(trainer)
            _register_other_models(tracker, trainer, model)

    def _wrap_training_step(self, trainer: Any) -> bool:
        """Wrap ``trainer.training_step`` so that the step begins on its batch (and, where ``train`` is not
        wrapped, a failure inside it is recorded). Whether this callback's steps are told their batch."""
        original = getattr(trainer, "training_step", None)
        if original is None:
            return False
        told = getattr(original, _TELLS, None)
        if told is not None:  # (wrapped by a callback before: this one's, or one that trains no more)
            return told is self
        callback = self
        record = not self._wrapped_train and not getattr(original, _WRAPPED, False)

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if callback._in_step == PENDING:
                callback._guard("training_step", callback._batch_begins, args, kwargs)
            try:
                return original(*args, **kwargs)
            except BaseException as exc:
                if record:
                    callback._record_failure(exc, close=False)
                raise

        setattr(wrapper, _WRAPPED, True)
        setattr(wrapper, _TELLS, self)
        trainer.training_step = wrapper
        return True

    def _batch_begins(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The step pending since ``on_step_begin`` begins on its batch (``training_step(model, inputs,
        ...)``); resting where the tracker says so."""
        tracker = self.tracker
        self._in_step = WATCHED
        if tracker is None:
            return
        inputs = kwargs["inputs"] if "inputs" in kwargs else args[1] if len(args) > 1 else None
        x = keyword_batch(inputs)  # (what the forward hook reads where the Trainer calls model(**inputs))
        if x is None:  # (not told: watched, its samples counted by the forward hook)
            tracker.begin_step()
        elif tracker.batch_begins(x):
            self._in_step = RESTING

    def _begun(self, event: str) -> bool:
        """Before a step's later event: a step still pending (its ``training_step`` never ran: a Trainer that
        calls another) begins now, and later steps begin at ``on_step_begin`` again. False: the step rests
        (the callback makes no call)."""
        if self._in_step == PENDING:
            self._tells = False
            self._in_step = WATCHED
            if self.tracker is not None:
                self._guard(event, self.tracker.begin_step)
        return self._in_step != RESTING

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is None:
            return
        if self._tells:  # (never where ANATOMY_TOP=0: _start found no Trainer then)
            self._in_step = PENDING  # (it begins on its batch, in training_step)
            return
        self._in_step = WATCHED
        self._guard("on_step_begin", self.tracker.begin_step)

    # (a resting step's events return at the first test: each line of ours run after the step's own work
    # finds the CPU's caches cold)
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._in_step != RESTING and self.tracker is not None and self._begun("on_pre_optimizer_step"):
            self._guard("on_pre_optimizer_step", self.tracker.optimizer_begin)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._in_step != RESTING and self.tracker is not None and self._begun("on_optimizer_step"):
            self._guard("on_optimizer_step", self.tracker.optimizer_end)

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        if self._tells and self._in_step >= WATCHED:  # (begun on its batch: the micro-batch's block ends)
            self._in_step = PENDING  # (the next micro-batch's block begins on its batch)
            self._guard("on_substep_end", tracker.end_step)
        elif self._begun("on_substep_end"):
            self._guard("on_substep_end", tracker.backward_end)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        tracker = self.tracker
        if tracker is not None:
            if self._in_step == PENDING:
                self._begun("on_step_end")
            self._in_step = OUTSIDE
            self._guard("on_step_end", tracker.end_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.tracker is not None:
            self._guard("on_train_end", self.tracker.close)

    def __getattr__(self, name: str) -> Any:
        # Only for names this class lacks: PyTorch Lightning looks up its own hooks (``setup`` first) and
        # ``state_key`` before any training step. Refused once, clearly, there — later look-ups (its
        # ``on_exception`` and ``teardown`` while it unwinds) find nothing, so no second error follows.
        if name in _LIGHTNING_NAMES:
            if not self.__dict__.get("_refused_lightning", False):
                self.__dict__["_refused_lightning"] = True
                raise TypeError(_WRONG_TRAINER)
            return None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


_WRONG_TRAINER = (
    "anatomy.AnatomyCallback is the Hugging Face Trainer's callback; for PyTorch Lightning use "
    "anatomy.lightning.AnatomyCallback (`from anatomy.lightning import AnatomyCallback`, then "
    "pl.Trainer(callbacks=[AnatomyCallback()]))"
)
_LIGHTNING_NAMES = frozenset(
    {
        "setup",
        "teardown",
        "state_key",
        "_legacy_state_key",
        "state_dict",
        "load_state_dict",
        "on_fit_start",
        "on_fit_end",
        "on_sanity_check_start",
        "on_sanity_check_end",
        "on_train_start",
        "on_train_batch_start",
        "on_train_batch_end",
        "on_train_epoch_start",
        "on_train_epoch_end",
        "on_validation_start",
        "on_validation_end",
        "on_test_start",
        "on_predict_start",
        "on_exception",
        "on_before_backward",
        "on_after_backward",
        "on_before_optimizer_step",
        "on_before_zero_grad",
        "on_save_checkpoint",
        "on_load_checkpoint",
    }
)
