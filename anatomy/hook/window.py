"""The saved-tensor count's window over a micro-batch: opened by the forward's pre-hook on a step that
counts, closed at the step's next boundary (a backward's end, the optimizer, the next micro-batch, the
step's end), its counts kept — the largest micro-batch's.

A layer of :class:`~anatomy.hook.tracker.Tracker` (see :mod:`anatomy.hook.tracker_state`), under the phase
hooks (:mod:`anatomy.hook.phases`), which open and close it.
"""

from __future__ import annotations

from anatomy.hook.guard import Feature
from anatomy.hook.record import StepRecord
from anatomy.hook.sampled import SampledSteps
from anatomy.hook.schedule import COUNT


class CountingWindow(SampledSteps):
    """Where a micro-batch's saved tensors are counted, and what the count keeps."""

    def _record_count(self, rec: StepRecord) -> None:
        """The micro-batch's window closed: keep the largest micro-batch's counts."""
        rec.window = False
        counter, sums = self._counter, self._sums
        acts = counter.activation_bytes
        rec.activations = acts if rec.activations is None else max(rec.activations, acts)
        rec.weight_copies = max(rec.weight_copies, counter.weight_copy_bytes)
        rec.inputs = max(rec.inputs, counter.input_bytes)
        sums.activations, sums.weight_copies, sums.inputs = rec.activations, rec.weight_copies, rec.inputs
        self._schedule.counted_step = rec.index
        self._schedule.charge(COUNT, counter.spent_s, rec.index)
        counter.spent_s = 0.0
        if counter.weight_copy_dtype is not None and counter.weight_copy_dtype != self._autocast_dtype:
            self._autocast_dtype = counter.weight_copy_dtype
            self._hello_changed()

    def _record_unsharded(self, rec: StepRecord) -> None:
        """FSDP's gathered parameters still held as the forward returns (the root's, or every layer's
        without reshard_after_forward): what stays allocated into backward. Read here, not when the window
        closes — that may be after backward, once FSDP has resharded everything."""
        counter = self._counter
        if not counter.unsharded_seen:
            return
        held = counter.unsharded_held_bytes(self.model.parameters())
        rec.unsharded = held if rec.unsharded is None else max(rec.unsharded, held)
        self._sums.unsharded = rec.unsharded

    def _close_window(self, rec: StepRecord) -> None:
        """Close the counting window at the step's next boundary (a backward's end, the optimizer, the
        next micro-batch, the step's end): what the loss saved after the model's forward is in it."""
        counter = self._counter
        if not rec.window and not counter.active:
            return
        with self._guard(Feature.ACTIVATIONS):
            counter.stop()
        if rec.window:
            self._record_count(rec)
