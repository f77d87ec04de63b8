"""The anatomy in the Hugging Face Trainer's own logs, so that whatever ``report_to`` names (TensorBoard,
Weights & Biases, MLflow...) receives it with no set-up of its own: TensorBoard shows ``train/anatomy/...``.

Why a separate callback at the head of the list: the Trainer builds its training log in
``_maybe_log_save_evaluate`` after ``on_step_end`` and hands the dict to ``on_log``, which calls the
callbacks in list order — the reporting integrations come right after ``DefaultFlowCallback`` and before
any user callback, so keys added in the user's ``on_log`` reach no logger. :class:`LogInjector` adds the
anatomy in ``on_log`` from the front of the list instead. It is a callback of its own (``on_log`` only),
so the AnatomyCallback keeps its place for every other event and the user's callbacks keep their order.

The console stays as it is without us: :class:`LogStripper`, just before the progress bar or printer
callback, takes back exactly the keys the injector added (a line of 20 byte counts per logging step would
bury the loss). ``state.log_history`` (trainer_state.json) is copied by the Trainer before ``on_log``, so
it never holds them either. The user's keys are never overwritten, renamed or removed.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from anatomy.log_metrics import snapshot_metrics
from anatomy.protocol import Snapshot

log = logging.getLogger("anatomy")

# The key every periodic training log of the Trainer holds (evaluation logs have ``eval_loss``, the
# end-of-training summary ``train_loss``, a user's ``trainer.log({...})`` its own keys).
TRAINING_LOG_KEY = "loss"


def _is_console(callback: Any) -> bool:
    if isinstance(callback, (ProgressCallback, PrinterCallback)):
        return True
    # Not imported here: the notebook module needs IPython, and a notebook run has imported it already.
    notebook = sys.modules.get("transformers.utils.notebook")
    cls = getattr(notebook, "NotebookProgressCallback", None) if notebook is not None else None
    return cls is not None and isinstance(callback, cls)


class LogInjector(TrainerCallback):
    """Adds the latest snapshot's ``anatomy/...`` metrics to each periodic training log."""

    def __init__(self, owner: Any, handler: Any, latest: Callable[[], Snapshot | None]) -> None:
        self.owner = owner
        self.handler = handler
        self._latest = latest
        self.added: dict[str, float] = {}  # what the last log got from us, for the stripper

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        self.added = {}
        try:
            if not isinstance(logs, dict) or TRAINING_LOG_KEY not in logs:
                return
            if not any(cb is self.owner for cb in self.handler.callbacks):  # the user removed our callback
                return
            snap = self._latest()
            if snap is None:
                return
            for key, value in snapshot_metrics(snap).items():
                if key not in logs:  # the user's own key of that name wins
                    logs[key] = value
                    self.added[key] = value
        except Exception as exc:  # a callback error would stop the Trainer: never let one out
            log.warning(
                "anatomy: adding the anatomy to the Trainer's logs failed (%s: %s)", type(exc).__name__, exc
            )


class LogStripper(TrainerCallback):
    """Takes the injector's keys back out before the console prints the log."""

    def __init__(self, injector: LogInjector) -> None:
        self.injector = injector

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        added, self.injector.added = self.injector.added, {}
        if not isinstance(logs, dict):
            return
        for key, value in added.items():
            if logs.get(key) is value:  # a callback in between may have replaced it: then it is theirs
                del logs[key]


def _installed_by(callback: Any, owner: Any) -> bool:
    if isinstance(callback, LogStripper):
        callback = callback.injector
    return isinstance(callback, LogInjector) and callback.owner is owner


def install(handler: Any, owner: Any, latest: Callable[[], Snapshot | None]) -> LogInjector:
    """Puts an injector at the head of ``handler``'s callbacks and a stripper before its console callback,
    replacing those of an earlier ``train()`` of the same owner (the console callback may have changed)."""
    callbacks = [cb for cb in handler.callbacks if not _installed_by(cb, owner)]
    injector = LogInjector(owner, handler, latest)
    console = next((i for i, cb in enumerate(callbacks) if _is_console(cb)), None)
    if console is not None:
        callbacks.insert(console, LogStripper(injector))
    callbacks.insert(0, injector)
    # A new list, not an insert: the handler is iterating the old one right now (this runs inside
    # on_train_begin), and an insert ahead of the running callback would deliver its event twice.
    handler.callbacks = callbacks
    return injector

