"""The sampled step's instruments: the op-group profiler and the per-op memory trace, started as a sampled
step begins and stopped as it ends.

A layer of :class:`~anatomy.hook.tracker.Tracker` (see :mod:`anatomy.hook.tracker_state`), under the phase
hooks (:mod:`anatomy.hook.phases`), which tell the running instruments each phase boundary.
"""

from __future__ import annotations

from anatomy.hook.attach import Attachment
from anatomy.hook.compiled import compile_in_use, outside_compile
from anatomy.hook.gradients import GradientWatcher
from anatomy.hook.guard import Feature
from anatomy.hook.held import Held
from anatomy.hook.opgroups import OpGroupProfiler
from anatomy.hook.record import StepRecord
from anatomy.hook.split import step_parts, traced_split
from anatomy.hook.trace import MemoryTrace


class SampledSteps(Attachment):
    """A sampled step's op-group profiler and per-op memory trace."""

    def _start_profiler(self, rec: StepRecord) -> None:
        with self._guard(Feature.OP_GROUPS):
            # Normalization modules are watched by module hooks, except where something is compiled:
            # a graph compiled while they are on would break at every norm for good.
            modules = () if compile_in_use(self.model) else self.model.modules()
            prof = OpGroupProfiler(modules, hook=outside_compile)
            prof.__enter__()
            rec.profiler = prof
            rec.profiled = True

    def _stop_profiler(self, rec: StepRecord, exc: BaseException | None) -> None:
        prof, rec.profiler = rec.profiler, None
        if prof is None:
            return
        with self._guard(Feature.OP_GROUPS):
            if exc is None:
                prof.__exit__(None, None, None)
                self._throughput.profile_finished(rec.index, prof)
            else:
                prof.__exit__(type(exc), exc, exc.__traceback__)

    def _probe_held(self) -> Held:
        rec = self._step
        watch = rec.grad_watch if rec is not None else None
        counter = self._counter
        return Held(counter.alive_activation_bytes, counter.alive_copy_bytes, watch.bytes if watch else 0)

    def _start_trace(self, rec: StepRecord) -> None:
        """The per-op memory trace: the glibc heap (CPU) or the allocator's allocated bytes (CUDA, a
        host-side counter: no synchronization), read after every op."""
        read = self._memory.trace_reader() if self._memory is not None else None
        if read is None or not self._guard.ok(Feature.HEAP_TRACE):
            return
        try:
            with self._guard(Feature.HEAP_TRACE):
                rec.grad_watch = GradientWatcher(self.model.parameters())
                self._counter.track_alive = True
                trace = MemoryTrace(read=read, probe=self._probe_held)
                trace.__enter__()
                rec.trace = trace
                rec.counting = True  # the trace needs this step's saved tensors
                self._schedule.retrace = False
                rec.profiled = True
        finally:
            if rec.trace is None:
                self._end_watch(rec)

    def _end_watch(self, rec: StepRecord) -> None:
        self._counter.track_alive = False
        watch, rec.grad_watch = rec.grad_watch, None
        if watch is not None:
            with self._guard(Feature.HEAP_TRACE):
                watch.close()

    def _stop_trace(self, rec: StepRecord) -> None:
        trace, rec.trace = rec.trace, None
        self._end_watch(rec)
        memory = self._memory
        if trace is None or memory is None:
            return
        with self._guard(Feature.HEAP_TRACE):
            trace.__exit__(None, None, None)
            start = memory.trace_start(rec)
            if start is not None:
                parts = step_parts(rec, self._sums)
                traced = traced_split(rec, trace, start, parts, self._sums.optimizer_states)
                if traced is not None:
                    memory.traced = traced
