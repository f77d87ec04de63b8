"""The anatomy in a Lightning trainer's loggers (``trainer.loggers``: TensorBoard, CSV, W&B, MLflow...), at
the steps Lightning logs its own training metrics (``log_every_n_steps``).

Why the trainer's logger connector and not ``pl_module.log``: ``log`` turns each value into a tensor on
the module's device (twenty host-to-device copies per logging step on a GPU) and reduces it as a float32,
which rounds byte counts (above 128 MiB to a multiple of 16 bytes); it would also put our keys among the
user's ``callback_metrics``, which checkpoint and early-stopping callbacks monitor. The connector's
``log_metrics`` is the route Lightning's own training metrics take to the loggers — the same step numbers
(its count of optimizer steps), an ``epoch`` column, each logger saved — and the numbers go exactly as
published. ``trainer.logged_metrics`` then lists them too, as it lists everything sent to the loggers.

Nothing of Lightning is imported here: the trainer is whichever Lightning the user's comes from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anatomy.log_metrics import snapshot_metrics
from anatomy.protocol import Snapshot


def log_snapshot(trainer: Any, latest: Callable[[], Snapshot | None]) -> bool:
    """At a step Lightning logs (call it from ``on_train_batch_end``, once the step is measured), the
    latest snapshot's ``anatomy/...`` metrics to the trainer's loggers. Whether anything was logged.
    ``latest`` is asked only at a step that is logged: an ordinary step's snapshot is made from its row
    when wanted, and Lightning logs one step in ``log_every_n_steps``."""
    if not getattr(trainer, "loggers", None):
        return False
    # Lightning's own tests for "this batch's metrics go to the loggers" (update_train_step_metrics): not a
    # micro-batch that only accumulates gradients, and a step of log_every_n_steps (or the last one).
    fit_loop = getattr(trainer, "fit_loop", None)
    automatic = getattr(getattr(trainer, "lightning_module", None), "automatic_optimization", True)
    if fit_loop is not None and automatic and fit_loop._should_accumulate():
        return False
    connector = getattr(trainer, "_logger_connector", None)
    if connector is None or not connector.should_update_logs:
        return False
    snap = latest()
    if snap is None:
        return False
    metrics = snapshot_metrics(snap)
    if not metrics:
        return False
    connector.log_metrics(dict(metrics))
    return True
