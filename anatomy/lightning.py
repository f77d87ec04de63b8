"""The PyTorch Lightning way in: ``pl.Trainer(callbacks=[anatomy.lightning.AnatomyCallback()])``.

Works with ``lightning.pytorch`` and with ``pytorch_lightning`` (whichever the Trainer comes from: the
callback subclasses the first one installed, and Lightning calls callback hooks by name).

How Lightning drives a step, and what the callback makes of it:

- a step block per training batch (``on_train_batch_start`` to ``on_train_batch_end``); a batch in which no
  optimizer updated (``accumulate_grad_batches``) is a micro-batch of the next one that does, so a step is
  one optimizer update (:meth:`anatomy.hook.tracker.Tracker.begin_step`);
- the forward is ``training_step`` as a whole — from the batch's start to the loss's backward
  (``on_before_backward``) — whether it calls ``self(...)`` or a submodule (``self.model(...)``, a GAN's
  generator and discriminator);
- in automatic optimization Lightning calls ``optimizer.step(closure)`` and runs forward and backward
  inside the closure; the tracker's optimizer hooks see the closure and begin the optimizer phase when it
  returns, so gradients are read after this step's backward;
- every optimizer of the module is tracked (a GAN's two): a step's optimizer states are their sum;
- validation, sanity checking, testing and prediction run outside step blocks in eval mode under
  ``no_grad``: never steps.

Only ``anatomy.hook`` (torch) is imported with this module; Lightning itself is the user's.
"""

from __future__ import annotations

import importlib
import logging
import sys
from pathlib import Path
from typing import Any

import torch

from anatomy.hook.lightning_logs import log_snapshot
from anatomy.hook.schedule import SAMPLE_EVERY
from anatomy.hook.tracker import Tracker, hook_disabled, track
from anatomy.recorder import RecordSetting

log = logging.getLogger("anatomy")


_PACKAGES = ("lightning.pytorch", "pytorch_lightning")


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


class _AnatomyCallback:
    """Measures every optimizer step of a Lightning ``fit`` and publishes it to anatomy-top."""

    def __init__(
        self,
        *,
        publish: bool = True,
        interval_s: float = 0.5,
        sample_every: int = SAMPLE_EVERY,
        directory: Path | None = None,
        log: bool = True,
        record: RecordSetting = None,
    ) -> None:
        super().__init__()
        self.publish = publish
        # The anatomy to the trainer's loggers at its logging steps. Not ``self.log``: Lightning assigns the
        # module's ``log``/``log_dict`` to every callback's attributes of those names when fit starts.
        self.log_to_loggers = log
        self.interval_s = interval_s
        self.sample_every = sample_every
        self.directory = directory
        # The flight recorder, as ``anatomy.track(record=...)``: None as ANATOMY_TOP_RECORD says, False off,
        # a path: that directory.
        self.record = record
        self.tracker: Tracker | None = None
        self._in_batch = False

    def _guard(self, event: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # a callback error would stop the fit: never let one out
            log.warning(
                "anatomy: the Lightning callback's %s failed (%s: %s)", event, type(exc).__name__, exc
            )

    # -- life cycle -------------------------------------------------------------------------------

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._guard("on_train_start", self._start, trainer, pl_module)

    def _start(self, trainer: Any, pl_module: Any) -> None:
        if hook_disabled():
            return
        tracker = self.tracker
        if tracker is not None and (tracker.model is not pl_module or tracker.closed):
            tracker.close()
            tracker = self.tracker = None
        optimizers = _optimizers(trainer)
        if tracker is None:
            tracker = self.tracker = track(
                pl_module,
                optimizers[0] if optimizers else None,
                publish=self.publish,
                interval_s=self.interval_s,
                sample_every=self.sample_every,
                grad_accum_steps=int(getattr(trainer, "accumulate_grad_batches", 1) or 1),
                directory=self.directory,
                record=self.record,
            )
        elif optimizers:
            tracker.attach_optimizer(optimizers[0])
        for opt in optimizers[1:]:
            tracker.add_optimizer(opt)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None:
            self._guard("on_train_end", self.tracker.close)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        try:
            tracker.record_oom(exception)
            tracker.close()
        except Exception as err:
            log.warning("anatomy: recording the failed step failed (%s)", err)

    # -- a training batch -------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        tracker = self.tracker
        if tracker is None:
            return
        self._in_batch = True
        x = _first_tensor(batch)
        samples = int(x.shape[0]) if x is not None and x.dim() >= 1 else None
        self._guard("on_train_batch_start", tracker.begin_step, samples)
        self._guard("on_train_batch_start", tracker.forward_begin, x)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.tracker is not None and self._in_batch:
            self._guard("on_before_backward", self.tracker.forward_end)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.tracker is not None and self._in_batch:
            self._guard("on_after_backward", self.tracker.backward_end)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        # (the optimizer's own step hooks mark it too; whichever comes first counts)
        if self.tracker is not None and self._in_batch:
            self._guard("on_before_optimizer_step", self.tracker.optimizer_begin)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.tracker is None or not self._in_batch:
            return
        self._in_batch = False
        self._guard("on_train_batch_end", self.tracker.forward_end)  # a step that never called backward
        self._guard("on_train_batch_end", self.tracker.end_step)
        if self.log_to_loggers:
            self._guard("on_train_batch_end", self._log_step, trainer)

    def _log_step(self, trainer: Any) -> None:
        if self.tracker is not None:
            log_snapshot(trainer, self.tracker.latest)


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
