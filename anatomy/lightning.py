"""The PyTorch Lightning way in: ``pl.Trainer(callbacks=[anatomy.lightning.AnatomyCallback()])``.

Works with ``lightning.pytorch`` and with ``pytorch_lightning`` (whichever the Trainer comes from: the
callback subclasses the first one installed, and Lightning calls callback hooks by name).

How Lightning drives a step, and what the callback makes of it:

- a step block per training batch (``on_train_batch_start`` to ``on_train_batch_end``); a batch in which no
  optimizer updated (``accumulate_grad_batches``) is a micro-batch of the next one that does, so a step is
  one optimizer update (:meth:`anatomy.hook.tracker.Tracker.begin_step`);
- the forward is ``training_step`` as a whole — from the batch's start to the loss's backward
  (``on_before_backward``) — whether it calls ``self(...)`` or a submodule (``self.model(...)``, a GAN's
  generator and discriminator); in manual optimization a later forward of the batch (the generator's,
  after the discriminator's update) runs from the last optimizer step's end to its loss's backward;
- in automatic optimization Lightning calls ``optimizer.step(closure)`` and runs forward and backward
  inside the closure; the tracker's optimizer hooks see the closure and begin the optimizer phase when it
  returns, so gradients are read after this step's backward;
- every optimizer of the module is tracked (a GAN's two): a step's optimizer states are their sum;
- validation, sanity checking, testing and prediction run outside step blocks in eval mode under
  ``no_grad``: never steps;
- the block's samples and tokens come from the batch (its first tensor: :meth:`Tracker.batch_begins`), so
  an ordinary step of the batch shape the last look saw rests, as README's loop does: none of the callback's
  calls reach the tracker until the batch ends, and no hook of ours runs in it.

Only ``anatomy.hook`` (torch) is imported with this module; Lightning itself is the user's.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import torch

from anatomy.hook.callback_base import CallbackBase
from anatomy.hook.lightning_logs import log_snapshot
from anatomy.hook.tracker import hook_disabled

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")
# Where a batch is: outside a training batch's step block, in a watched one, in a resting one (the tracker's
# hooks off: the callback's calls would only wake them).
OUTSIDE, WATCHED, RESTING = 0, 1, 2


def _lightning_callback_bases() -> tuple[type, ...]:
    """The ``Callback`` class of each Lightning already imported (both, when both are: the callback is
    then an instance of either's), else of the first one installed."""
    loaded = [sys.modules[name] for name in _PACKAGES if name in sys.modules]
    bases = [module.Callback for module in loaded if isinstance(getattr(module, "Callback", None), type)]
    if bases:
        return tuple(bases)
    for name in _PACKAGES:
        try:
            return (importlib.import_module(name).Callback,)
        except ImportError:
            continue
    raise ImportError(
        "anatomy.lightning.AnatomyCallback needs PyTorch Lightning (lightning or pytorch_lightning)"
    )


def _first_tensor(batch: Any, depth: int = 3) -> torch.Tensor | None:
    """The batch's first tensor (a tensor, a tuple or list, or a mapping of them)."""
    if isinstance(batch, torch.Tensor):
        return batch
    if depth <= 0:
        return None
    values: Any = batch.values() if isinstance(batch, dict) else batch
    if isinstance(values, (tuple, list)) or isinstance(batch, dict):
        for value in values:
            found = _first_tensor(value, depth - 1)
            if found is not None:
                return found
    return None


def _optimizers(trainer: Any) -> list[Any]:
    return [opt for opt in (getattr(trainer, "optimizers", None) or []) if opt is not None]


class _AnatomyCallback(CallbackBase):
    """Measures every optimizer step of a Lightning ``fit`` and publishes it to anatomy-top.

    Keyword settings (``publish``, ``interval_s``, ``sample_every``, ``directory``, ``log``, ``record``):
    :class:`anatomy.hook.callback_base.CallbackBase`."""

    framework = "Lightning"
    _in_batch = OUTSIDE  # set per instance: inside a training batch's step block, watched or resting

    # -- life cycle -------------------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._guard("on_train_start", self._start, trainer, pl_module)

    def _start(self, trainer: Any, pl_module: Any) -> None:
        if hook_disabled():
            return
        tracker = self._current_tracker(pl_module)
        optimizers = _optimizers(trainer)
        if tracker is None:
            tracker = self._track(
                pl_module,
                optimizers[0] if optimizers else None,
                grad_accum_steps=int(getattr(trainer, "accumulate_grad_batches", 1) or 1),
            )
        elif optimizers:
            tracker.attach_optimizer(optimizers[0])
        for opt in optimizers[1:]:
            tracker.add_optimizer(opt)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None:
            self._guard("on_train_end", self.tracker.close)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._record_failure(exception, close=True)

    # -- a training batch -------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        x = _first_tensor(batch)
        if self._guard("on_train_batch_start", tracker.batch_begins, x):
            self._in_batch = RESTING  # (a resting step: none of our calls until the batch ends)
            return
        self._in_batch = WATCHED
        self._guard("on_train_batch_start", tracker.forward_begin, x)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.tracker is not None and self._in_batch == WATCHED:
            self._guard("on_before_backward", self.tracker.backward_begin)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None and self._in_batch == WATCHED:
            self._guard("on_after_backward", self.tracker.backward_end)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        # (the optimizer's own step hooks mark it too; whichever comes first counts)
        if self.tracker is not None and self._in_batch == WATCHED:
            self._guard("on_before_optimizer_step", self.tracker.optimizer_begin)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        within = self._in_batch
        if self.tracker is None or not within:
            return
        self._in_batch = OUTSIDE
        if within == WATCHED:  # a step that never called backward
            self._guard("on_train_batch_end", self.tracker.forward_end)
        self._guard("on_train_batch_end", self.tracker.end_step)
        if self.log_to_loggers:  # (the snapshot is made only where Lightning logs the step)
            self._guard("on_train_batch_end", log_snapshot, trainer, self._latest)


_CLASS: type | None = None


def _callback_class() -> type:
    global _CLASS
    if _CLASS is None:
        _CLASS = type(
            "AnatomyCallback",
            (_AnatomyCallback, *_lightning_callback_bases()),
            {"__module__": __name__, "__doc__": _AnatomyCallback.__doc__, "__qualname__": "AnatomyCallback"},
        )
    return _CLASS


def __getattr__(name: str) -> object:
    # Built on first use, as a subclass of the installed Lightning's Callback (Lightning type-checks
    # its callbacks): importing this module does not import Lightning.
    if name == "AnatomyCallback":
        return _callback_class()
    raise AttributeError(f"module 'anatomy.lightning' has no attribute {name!r}")


TYPE_CHECKING = False
if TYPE_CHECKING:
    AnatomyCallback = _AnatomyCallback

__all__ = ["AnatomyCallback"]
