"""What the Hugging Face Trainer callback (:mod:`anatomy.hook.callback`) and the Lightning callback
(:mod:`anatomy.lightning`) share: their settings, the guard that keeps a failure of theirs out of the
training, the tracker they start (or keep) for the model, and the failed step they record.

Imports neither transformers nor Lightning: each callback adds its framework's base class itself.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from anatomy.hook.schedule import SAMPLE_EVERY
from anatomy.hook.tracker import Tracker, track
from anatomy.protocol import Snapshot
from anatomy.recorder import RecordSetting

log = logging.getLogger("anatomy")


class CallbackBase:
    """The settings of ``anatomy.track`` a callback passes on, and its tracker."""

    # How the guard's warning names the callback ("the Trainer callback's on_step_end failed").
    framework = ""

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
        super().__init__()  # the framework's Callback, where the subclass adds one
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

    def _latest(self) -> Snapshot | None:
        """The tracker's latest snapshot, asked for where a logger takes one (made from its row then)."""
        return self.tracker.latest if self.tracker is not None else None

    def _guard(self, event: str, fn: Any, *args: Any) -> Any:
        """``fn(*args)``'s result; None where it failed (said once in the log, never raised)."""
        try:
            return fn(*args)
        except Exception as exc:  # a callback error would stop the training: never let one out
            name = type(exc).__name__
            log.warning("anatomy: the %s callback's %s failed (%s: %s)", self.framework, event, name, exc)
            return None

    def _current_tracker(self, model: Any) -> Tracker | None:
        """The tracker, if it still measures ``model``; one closed or of another model is closed and
        dropped (a second ``train``/``fit`` of another model starts a tracker of its own)."""
        tracker = self.tracker
        if tracker is not None and (tracker.model is not model or tracker.closed):
            tracker.close()
            tracker = self.tracker = None
        return tracker

    def _track(self, model: Any, optimizer: Any, grad_accum_steps: int) -> Tracker:
        self.tracker = track(
            model,
            optimizer,
            publish=self.publish,
            interval_s=self.interval_s,
            sample_every=self.sample_every,
            grad_accum_steps=grad_accum_steps,
            directory=self.directory,
            record=self.record,
        )
        return self.tracker

    def _record_failure(self, exc: BaseException, close: bool) -> None:
        """The out-of-memory file for a step that raised ``exc`` (and the tracker closed, if ``close``):
        never raises, so the training's own exception is the one that propagates."""
        tracker = self.tracker
        if tracker is None:
            return
        try:
            tracker.record_oom(exc)
            if close:
                tracker.close()
        except Exception as err:
            log.warning("anatomy: recording the failed step failed (%s)", err)


__all__ = ["CallbackBase"]
