"""The finished step's snapshot: an ordinary step's is the last one repeated — a row in the step feed
(:meth:`StepSnapshots._repeat`, or on the host clock ``Tracker._end_plain``), made into a snapshot only
where one is wanted; any other is built in full (:meth:`StepSnapshots._build`): its record, the sums,
the memory backend's peak and what the tracker knows go once to the pure
:func:`anatomy.hook.assembly.assemble`. Then the advisor's suggestions, publishing, and the OOM record.

A layer of :class:`~anatomy.hook.tracker.Tracker` (see :mod:`anatomy.hook.tracker_state`).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import replace
from pathlib import Path
from time import perf_counter

from anatomy import advisor
from anatomy.hook.assembly import (
    Assembled,
    SnapshotFacts,
    StepFacts,
    assemble,
    batch_size,
    snapshot,
    stamp,
    unmeasured,
)
from anatomy.hook.backend import CudaBackend
from anatomy.hook.framework import FrameworkCalls
from anatomy.hook.guard import Feature
from anatomy.hook.record import StepRecord
from anatomy.hook.split import step_parts
from anatomy.hook.throughput import Throughput
from anatomy.protocol import Snapshot, Suggestion
from anatomy.protocol.publisher import Publisher
from anatomy.vocabulary import MemorySource

log = logging.getLogger("anatomy")
_NAN = math.nan


class StepSnapshots(FrameworkCalls):
    """A finished step's snapshot, the latest one, and where it goes."""

    @property
    def error(self) -> str | None:
        """Why the hook measures less than it could (what failed), or None."""
        return self._guard.error

    @property
    def latest(self) -> Snapshot | None:
        """The snapshot of the last finished step (an ordinary step's is made from its row when asked)."""
        snap = self._feed.latest()
        return snap if snap is not None else self._latest

    def rebuild(self) -> Snapshot | None:
        """The last finished step's snapshot built in full now, as a step that measured would be (an
        ordinary step's snapshot is the last one repeated, which this equals); it becomes the latest."""
        rec = self._last_record()
        if rec is None:
            return self.latest
        if rec.plain:  # an ordinary step ended in O(1): what its full end would have added, now
            rec.plain = False
            if self._memory is not None:
                self._memory.step_ends(rec, stats_due=False)
            self._throughput.ready(rec)
        return self._build(rec, replace=True)

    def _repeat(self, rec: StepRecord) -> bool:
        """An ordinary step's row in the step feed, O(1): the last snapshot built with this step's number,
        time and timing. Only where every other figure would come out the same — nothing was measured on
        this step (no count, no re-sum, no heap read, no trace), the same micro-batches and batch size, no
        new error, and on CUDA the same peak from the same start. Otherwise (False) the full build."""
        last = self._latest
        if last is None or rec.profiled or rec.activations is not None:
            return False
        if rec.refresh or rec.index == self._forced_refresh or self._guard.version != self._built_errors:
            return False
        if stamp(rec, self._sums, batch_size(rec, self._throughput.default_samples)) != self._built_stamp:
            return False
        memory = self._memory
        if memory is not None and not memory.is_cuda and (rec.heap_on or rec.heap_from is None):
            return False
        if isinstance(memory, CudaBackend):
            start = rec.cuda_start
            if start is None or not rec.cuda_peaks:
                return False
            # the same peak in the same phase; which step measured it may be this one (a user who resets
            # the peak every step makes every step's exact): the repeated snapshot names the built one's
            built_peak = memory.last_peak
            peak, phase, _step = memory.step_peak(rec, start)
            if built_peak is None or peak != built_peak[0] or phase is not built_peak[1]:
                return False
        try:
            throughput = self._throughput
            throughput.update_timing()
            self._seq += 1
            self._feed.put(last, self._seq, time.time(), rec.index, throughput.timing)
            return True
        except Exception as exc:
            self._guard.fail(Feature.SNAPSHOT, exc)
        return False

    def _build(
        self, rec: StepRecord | None, oom: str | None = None, replace: bool = False
    ) -> Snapshot | None:
        """The snapshot of the finished step ``rec`` (None: no step finished yet), built in full: its named
        tensors and the memory backend's peak of it, with what the tracker knows, go to
        :func:`anatomy.hook.assembly.assemble` once. Without ``oom`` it becomes the latest (``replace``: in
        place of the last row of the step feed, the same step built again); with it (the error's text) it
        is the OOM record."""
        self._gate.close()  # (resting rows repeat the build: the step that built says again whether they may)
        snap = None
        built_stamp = None
        with self._guard(Feature.SNAPSHOT):
            if rec is None:
                weights = self._sums.weights if self.enabled else None
                snap = snapshot(unmeasured(self._steps_done, weights), self._snapshot_facts(), oom)
            else:
                built = self._assembled(rec, oom)
                snap, built_stamp = built.snapshot, built.stamp
            snap = self._advised(snap, oom)
        if snap is None:
            return self.latest
        if oom is None:
            self._latest = snap
            self._last_built = perf_counter()
            self._built_errors = self._guard.version
            self._built_stamp = built_stamp
            # What an ordinary step compares with to be this snapshot repeated (Tracker._end_plain).
            if rec is not None:
                samples = rec.samples if rec.samples is not None else self._throughput.default_samples
                self._base_micro, self._base_grads_begin = rec.micro, rec.grads_begin
                self._base_samples = samples if samples is not None else (rec.samples_seen or None)
            else:
                self._base_micro = -1
            self._base_peak = _NAN if snap.peak_bytes is None else float(snap.peak_bytes)
            self._feed.put_built(snap, replace=replace)
        return snap

    def _assembled(self, rec: StepRecord, oom: str | None) -> Assembled:
        """The step's named tensors and the backend's peak of it (the backend keeps what the next steps
        need), then the pure assembly of its figures."""
        sums = self._sums
        parts = step_parts(rec, sums)
        backend = self._memory
        split = backend.peak(rec, parts) if backend is not None else None
        built = assemble(rec, parts, sums, split, self._step_facts(), self._snapshot_facts(), oom)
        if built.excess and not self._balance_logged:
            self._balance_logged = True
            log.info(
                "anatomy: the named tensors exceed the step's peak by %d bytes; taken off unattributed",
                built.excess,
            )
        return built

    def _step_facts(self) -> StepFacts:
        """What a step's memory figures need of the tracker, as the step is built."""
        backend = self._memory
        return StepFacts(
            off=frozenset(self._guard.off),
            has_optimizer=self._optimizer is not None,
            counted_step=self._schedule.counted_step,
            has_others=bool(self._others),
            managed=self._managed,
            default_samples=self._throughput.default_samples,
            runtime=backend.runtime if backend is not None else None,
            source=backend.source if backend is not None else MemorySource.NONE,
        )

    def _snapshot_facts(self) -> SnapshotFacts:
        """What a snapshot holds besides the step's memory figures: the newest step times, the rates, the
        guide's bytes per parameter (counts the snapshot: its ``seq``)."""
        throughput = self._throughput
        throughput.update_timing()
        precision = self.precision
        device_name, tf32 = None, False
        if self._is_cuda:
            hello = self.hello
            device_name, tf32 = hello.device_name, bool(hello.tf32)
        achieved, mfu = throughput.rates(device_name, precision, tf32)
        self._seq += 1
        return SnapshotFacts(
            pid=os.getpid(),
            seq=self._seq,
            time=time.time(),
            expected_bytes_per_param=self._expected_bytes(precision),
            parameter_count=self._param_count if self.enabled else 0,
            trainable_parameter_count=self._trainable_count if self.enabled else None,
            timing=throughput.timing,
            op_groups=throughput.op_groups,
            op_groups_step=throughput.op_groups_step,
            achieved_tflops=achieved,
            mfu=mfu,
            grad_accum_steps=self.grad_accum_steps,
            error=self.error,
        )

    def _advised(self, snap: Snapshot, oom: str | None) -> Snapshot:
        """The snapshot with the advisor's suggestions. The advisor, the costliest part of a build, runs
        at most once per publish interval (and for an OOM record); its suggestions stand in between."""
        now = perf_counter()
        if oom is not None or now - self._advised_at >= self.interval_s:
            self._suggestions = self._advise(snap)
            self._advised_at = now
        suggestions = self._suggestions
        if suggestions or snap.error != self.error:  # the advisor's own failure shows at once
            snap = replace(snap, suggestions=list(suggestions), error=self.error)
        return snap

    def _advise(self, snap: Snapshot) -> list[Suggestion]:
        if not self._guard.ok(Feature.ADVISOR):
            return []
        with self._guard(Feature.ADVISOR):
            out = advisor.advise(self.hello, snap, tuple(self.history), None)
            return [s for s in out if isinstance(s, Suggestion)][:64]
        return []

    @property
    def publisher(self) -> Publisher | None:
        """The publisher serving this tracker's socket (opened with the set-up): None without publishing,
        where the socket could not open, or after ``close()``."""
        return self._channel.publisher

    @property
    def throughput(self) -> Throughput:
        """Step times, op groups and FLOP rate as resolved so far (``timing_step``: whose times the
        latest are; ``pending``: clocks not yet readable)."""
        return self._throughput

    def _publish_latest(self) -> None:
        """A changed set-up reaches the publisher before the next snapshot; the publisher starts with the
        first call (the set-up's: it follows the step feed from then on)."""
        if self._hello_stale:  # the set-up changed: the monitor learns it before this step
            self._hello_stale = False
            self._channel.set_hello(self.hello)
        self._channel.publish(self.hello)

    def _write_oom(self, exc: BaseException) -> Path | None:
        """The last snapshot, with the error text, to the OOM file. Never raises."""
        # By id: holding the exception would keep its traceback's frames (and tensors) alive.
        if not self._channel.enabled or id(exc) == self._oom_recorded:
            return self._oom_path  # already written for this exception (step, then tracker, exit)
        self._oom_recorded = id(exc)
        with self._guard(Feature.OOM):
            snap = self._build(self._last_record(), oom=f"{type(exc).__name__}: {exc}")
            if snap is None:
                return None
            self._oom_path = self._channel.write_oom(snap, self.hello)
            return self._oom_path
        return None
