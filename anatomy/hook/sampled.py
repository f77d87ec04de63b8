"""The sampled step's instruments: the op-group profiler and the per-op memory trace.

A sampled episode (step 1, then one in ``sample_every`` as the budget allows) runs the profiler, then —
when a trace is due — the trace, never both on one step. A model with a stack of repeated blocks is
instrumented in pieces over consecutive steps (:mod:`anatomy.hook.pieces`), each sized to add about a
third of a step (its optimizer's step in windows of its calls); a smaller one whole, on one step each. Op
groups and the traced peak stand for the whole step once their last piece has run.

A layer of :class:`~anatomy.hook.tracker.Tracker` (see :mod:`anatomy.hook.tracker_state`), under the phase
hooks (:mod:`anatomy.hook.phases`), which tell the running instruments each phase boundary.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from torch.utils._python_dispatch import TorchDispatchMode

from anatomy.hook.attach import Attachment
from anatomy.hook.compiled import compile_in_use, outside_compile
from anatomy.hook.gradients import GradientWatcher
from anatomy.hook.guard import Feature
from anatomy.hook.held import Held
from anatomy.hook.opgroups import OpGroupProfiler
from anatomy.hook.pieces import WINDOW_SHARE, Piece, PiecePlan, repeated_blocks
from anatomy.hook.record import StepRecord
from anatomy.hook.split import step_parts, traced_split
from anatomy.hook.trace import MemoryTrace

PROFILE = "profile"
TRACE = "trace"
FIRST_PIECE_SHARE = 16  # the first piece of a stack: 1/16 of its blocks (then sized by what it cost)


class SampledSteps(Attachment):
    """A sampled step's op-group profiler and per-op memory trace, whole or in pieces."""

    def _sampled_kind(self, index: int, quiet: bool) -> str | None:
        """The instrument this step runs: the next piece of the episode in progress, or the first of a new
        one where a sampled step is due."""
        if self._episode:
            return self._episode[0]
        sched = self._schedule
        if quiet or not sched.sample_due(index):
            return None
        kinds = []
        if self._guard.ok(Feature.OP_GROUPS):
            kinds.append(PROFILE)
        memory = self._memory
        if sched.trace_due(index, memory is not None and memory.traced is not None):
            kinds.append(TRACE)
        self._episode = kinds
        # (a compiled model's graphs are whole: its pieces would not be the ops they stand for)
        compiled = any(m.__dict__.get("_compiled_call_impl") is not None for m in self.model.modules())
        self._blocks = (
            []
            if compiled or type(self.model).__name__ == "OptimizedModule"
            else (repeated_blocks(self.model))
        )
        return kinds[0] if kinds else None

    def _start_sampled(self, rec: StepRecord, kind: str) -> None:
        rec.began_s = time.perf_counter()
        if kind == PROFILE:
            self._start_profiler(rec)
        else:
            self._start_trace(rec)
        if rec.profiler is None and rec.trace is None:  # (failed to start: the episode moves on)
            self._episode = self._episode[1:]
            self._plan = None

    def _piece(self, mode: TorchDispatchMode, kind: str) -> Piece | None:
        """The next piece of a stack of blocks for ``mode`` (None: the step is instrumented whole)."""
        blocks = self._blocks
        if not blocks:
            return None
        plan = self._plan
        if plan is None or plan.done:
            per = self._per_piece.get(kind) or max(1, len(blocks) // FIRST_PIECE_SHARE)
            plan = self._plan = PiecePlan(blocks, per)
        first, stop, optimizer = plan.next()
        window_s = math.inf  # (a run of blocks: no window; where anything is compiled, the optimizer's step
        # whole, under a dispatch mode Dynamo ignores: a function mode it would trace)
        if optimizer and not compile_in_use(self.model):
            # (before any unprofiled step is timed — the first episode — the quickest of its steps so far
            # stands for a usual one: an overestimate, each of them ran a piece)
            window_s = WINDOW_SHARE * (self._schedule.median_step_s or self._fastest_piece_s)
        piece = Piece(
            mode,
            blocks,
            first,
            stop,
            optimizer=optimizer,
            wrap=outside_compile,
            call_first=plan.next_call,
            window_s=window_s,
        )
        piece.open(p for m in piece.modules(self.model) for p in m.parameters(recurse=False))
        return piece

    def _piece_done(self, rec: StepRecord, kind: str) -> bool:
        """The step's piece ran: the plan moves on (the next piece sized by what this one cost). Whether
        the instrument's round is complete (the whole step covered)."""
        piece, rec.piece = rec.piece, None
        if piece is None:
            self._episode = self._episode[1:]
            return True
        piece.close()
        plan = self._plan
        if plan is None:
            return True
        median = self._schedule.median_step_s
        share = None
        if rec.began_s:
            took = time.perf_counter() - rec.began_s
            # (less the time an optimizer's window was open: nearer a usual step)
            self._fastest_piece_s = min(self._fastest_piece_s, took - piece.window_used)
            if median > 0:
                share = max(took - median, 0.0) / median
        plan.finished(piece.first, piece.stop, piece.optimizer, share, piece.calls_left)
        if not piece.optimizer:
            self._per_piece[kind] = plan.per_piece
        if plan.done:
            self._episode = self._episode[1:]
            self._plan = None
        return plan.done

    def _start_profiler(self, rec: StepRecord) -> None:
        with self._guard(Feature.OP_GROUPS):
            # Normalization modules are watched by module hooks, except where something is compiled:
            # a graph compiled while they are on would break at every norm for good.
            compiled = compile_in_use(self.model)
            # (a model on the CPU: every op timed on the host, no device looked up per op)
            on_cpu = self._device is not None and self._device.type == "cpu"
            prof = OpGroupProfiler((), hook=outside_compile, cuda=not on_cpu)
            piece = self._piece(prof, PROFILE)
            if not compiled:  # the norm watch: over the piece's own modules (a piece of blocks)
                prof.watch(piece.modules(self.model) if piece is not None else self.model.modules())
            if piece is None:
                prof.__enter__()
            else:
                prof.begin()  # (the mode itself: only while the piece's ops run)
                rec.piece = piece
            rec.profiler = prof
            rec.profiled = True

    def _stop_profiler(self, rec: StepRecord, exc: BaseException | None) -> None:
        prof, rec.profiler = rec.profiler, None
        if prof is None:
            return
        with self._guard(Feature.OP_GROUPS):
            whole = rec.piece is None
            complete = self._piece_done(rec, PROFILE)
            if not whole:
                prof.end()
            elif exc is None:
                prof.__exit__(None, None, None)
            else:
                prof.__exit__(type(exc), exc, exc.__traceback__)
            if exc is None:
                self._throughput.profile_finished(rec.index, prof, complete)

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
                piece = self._piece(trace, TRACE)
                if piece is None:
                    trace.__enter__()
                else:
                    rec.piece = piece
                rec.trace = trace
                rec.counting = True  # the trace needs this step's saved tensors
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
        if trace is None:
            return
        with self._guard(Feature.HEAP_TRACE):
            whole = rec.piece is None
            complete = self._piece_done(rec, TRACE)
            if whole:
                trace.__exit__(None, None, None)
            start = memory.trace_start(rec) if memory is not None else None
            if memory is None or start is None:
                return
            traced = traced_split(rec, trace, start, step_parts(rec, self._sums), self._sums.optimizer_states)
            best = self._traced_best
            if traced is not None:
                if best is not None and best.growth >= traced.growth:
                    traced = replace(best, temporaries=max(best.temporaries, traced.temporaries))
                elif best is not None:
                    traced = replace(traced, temporaries=max(best.temporaries, traced.temporaries))
                best = self._traced_best = traced
            if complete:  # every piece traced: the highest of them stands for the step
                self._traced_best = None
                if best is not None:
                    memory.traced = best
                    self._schedule.retrace = False
