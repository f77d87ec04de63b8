"""Memory backends: where a step's peak comes from, one per device kind.

CPU (:class:`HeapBackend`): glibc's heap in use, read at the phase boundaries of the steps the schedule
picks; a step that did not read reports the last read step's readings. CUDA (:class:`CudaBackend`): the
caching allocator's peak, a window per phase. Both give the per-op trace its reader, and turn a finished
step into a :class:`PeakSplit`.
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter

import torch

from anatomy.hook.cuda import CudaAllocator, CudaStats
from anatomy.hook.guard import Feature, Guard
from anatomy.hook.heap import HostHeap
from anatomy.hook.record import (
    HeapHistory,
    Held,
    KnownGrowth,
    MemorySource,
    PeakSplit,
    PhasePeak,
    Reading,
    StepParts,
    StepRecord,
    Traced,
)
from anatomy.hook.split import explained, held_in_phase
from anatomy.hook.timing import usual_marks
from anatomy.protocol import CudaMemory
from anatomy.vocabulary import Phase


class HeapBackend:
    """CPU: glibc's heap in use at the phase boundaries, absolute (interpreter and libraries included)."""

    source = MemorySource.GLIBC
    is_cuda = False

    def __init__(self, heap: HostHeap, guard: Guard) -> None:
        self.heap = heap
        self._guard = guard
        self.traced: Traced | None = None
        self.history: HeapHistory | None = None  # the last step that read the heap
        self.runtime: int | None = None  # the heap in use before the first step beyond the model
        self.spent_s = 0.0  # time spent reading the heap at boundaries
        if not heap.available:
            guard.turn_off(Feature.HEAP)

    def _read(self) -> int | None:
        if not self._guard.ok(Feature.HEAP):
            return None
        with self._guard(Feature.HEAP):
            began = perf_counter()
            now = self.heap.in_use()
            self.spent_s += perf_counter() - began  # mallinfo2 walks the arenas: ~0.1-1 ms on a big heap
            return now
        return None

    def take_spent(self) -> float:
        """Seconds spent reading since the last call (for the schedule's budget)."""
        spent, self.spent_s = self.spent_s, 0.0
        return spent

    def read_start(self, rec: StepRecord) -> None:
        if not rec.heap_on:
            return
        now = self._read()
        if now is not None:
            rec.heap_start = now

    def read(self, rec: StepRecord, phase: Phase, explained: int, held: Held) -> None:
        if not rec.heap_on:
            return
        now = self._read()
        if now is None:
            return
        if rec.heap_start is None:
            rec.heap_start = now
        rec.readings.append(Reading(phase, now, explained, held))

    def phase_ends(self, rec: StepRecord, next_phase: Phase) -> None:
        return None

    def measure_runtime(self, rec: StepRecord, parts: StepParts, communication: int = 0) -> None:
        """The runtime baseline, once, from the first step that read the heap: what was in use at its
        start beyond weights, optimizer states, gradients, the inputs and communication buffers
        (interpreter, torch, libraries, the data pipeline): the CPU counterpart of the CUDA context."""
        if rec.heap_start is not None:
            self.runtime = max(rec.heap_start - parts.at_start - parts.inputs - communication, 0)

    def step_ends(self, rec: StepRecord, stats_due: bool) -> int | None:
        """Keep a read step's readings; give a step that did not read the last ones. Returns the
        index of the last step that read the heap."""
        if rec.heap_on:
            if rec.heap_start is not None and rec.readings:
                self.history = HeapHistory(rec.index, rec.heap_start, rec.readings)
        elif self.history is not None:
            last = self.history
            rec.heap_from, rec.heap_start, rec.readings = last.step, last.start, last.readings
        return self.history.step if self.history is not None else None

    def trace_reader(self) -> Callable[[], int | None] | None:
        if not self._guard.ok(Feature.HEAP):
            return None
        reader = getattr(self.heap, "reader", None)  # (a heap of the tests' may have in_use alone)
        return reader() if reader is not None else self.heap.in_use

    def trace_start(self, rec: StepRecord) -> int | None:
        return rec.heap_start

    def peak(self, rec: StepRecord, parts: StepParts) -> PeakSplit | None:
        start = rec.heap_start
        if start is None or not rec.readings or not self._guard.ok(Feature.HEAP):
            return None
        temporaries = max(max(r.in_use - start - r.explained for r in rec.readings), 0)
        # The split at the peak comes from the per-op trace, which sees inside the phases; the boundary
        # readings give it only before the first trace, or when they rise clearly above the traced peak
        # (the shapes changed: a new trace is due). The peak itself is the highest reading either way;
        # what the split does not name goes to temporaries.
        top = max(rec.readings, key=lambda r: r.in_use)
        peak, phase, held = top.in_use, top.phase, top.held
        at_peak_step = rec.heap_from if rec.heap_from is not None else rec.index
        traced = self.traced
        if traced is not None:
            temporaries = max(temporaries, traced.temporaries)
            if traced.step == rec.index or top.in_use - start <= traced.growth * 1.1:
                peak, phase, held, at_peak_step = (
                    start + traced.growth,
                    traced.phase,
                    traced.held,
                    traced.step,
                )
                if traced.step != rec.index:
                    peak = max(peak, top.in_use)
        rest = start - parts.at_start
        return PeakSplit(
            peak=max(peak, start),
            phase=phase,
            temporaries=temporaries,
            preexisting=rest if rest >= 0 else None,
            held=held,
            at_peak_step=at_peak_step,
        )


class CudaBackend:
    """CUDA: the caching allocator's allocated bytes at the phase boundaries and its process-wide peak,
    read and never reset. A phase during which the peak rose reached it: that phase's peak is exact. A
    step that sets no new high (the steady state) reports the growth last measured exactly — by a rising
    step or by the per-op trace of a sampled step — bounded below by its own boundary readings and above
    by the process-wide peak; ``at_peak_step`` names the step it comes from."""

    source = MemorySource.CUDA_ALLOCATOR
    is_cuda = True

    def __init__(self, allocator: CudaAllocator, guard: Guard) -> None:
        self.allocator = allocator
        self._guard = guard
        self.traced: Traced | None = None
        self.runtime: int | None = None  # CUDA: the context is NVML's figure (the monitor's)
        self.known: KnownGrowth | None = None
        self._last_stats: CudaStats | None = None  # a full statistics read, only for a snapshot
        self.last_peak: tuple[int, Phase, int] | None = None  # the last snapshot's (peak, phase, step)
        # The last step that read: (its start, the process-wide peak and allocated at its end) — what an
        # ordinary (lean) step, which reads once at its end, is compared with.
        self.steady: tuple[int, int, int] | None = None

    def read_start(self, rec: StepRecord) -> None:
        return None

    def read(self, rec: StepRecord, phase: Phase, explained: int, held: Held) -> None:
        return None

    def take_spent(self) -> float:
        return 0.0  # a boundary reading is a host-side counter (no walk)

    def phase_ends(self, rec: StepRecord, next_phase: Phase) -> None:
        # (on the per-step path: the guard's section written out)
        if Feature.CUDA in self._guard.off:
            return
        try:
            allocated, peak = self.allocator.current_and_peak()
            if rec.cuda_start is None:
                rec.cuda_start = allocated
            elif peak > rec.cuda_high:  # the maximum was reached in this phase
                rec.cuda_peaks.append(PhasePeak(rec.cuda_phase, peak, exact=True))
            else:  # below the high (or the user reset the peak meanwhile): the boundaries bound it
                bound = max(rec.cuda_phase_start, allocated, peak if peak < rec.cuda_high else 0)
                rec.cuda_peaks.append(PhasePeak(rec.cuda_phase, bound, exact=False))
            rec.cuda_high = peak
            rec.cuda_phase_start = allocated
            rec.cuda_phase = next_phase
        except Exception as exc:
            self._guard.fail(Feature.CUDA, exc)

    def step_ends(self, rec: StepRecord, stats_due: bool) -> int | None:
        self.phase_ends(rec, Phase.OTHER)
        # Only a usual step's readings (its start read as its first forward began, before any optimizer) are
        # what an ordinary step that reads nothing repeats — one forward in each of its blocks (gradient
        # accumulation in blocks: usual_marks): after any other (a forward in a closure, two forwards in a
        # block) the next step reads in full.
        self.steady = None
        blocks = rec.blocks
        plain = rec.micro == blocks and not rec.closure
        usual = plain and usual_marks([kind for kind, _ in rec.clock.marks], blocks)
        if usual and rec.cuda_start is not None and Feature.CUDA not in self._guard.off:
            self.steady = (rec.cuda_start, rec.cuda_high, rec.cuda_phase_start)
        if stats_due and self._guard.ok(Feature.CUDA):  # a full statistics read (~0.1 ms)
            with self._guard(Feature.CUDA):
                self._last_stats = self.allocator.stats()
        rec.cuda_end = self._last_stats
        # A step that read the allocator at its phase boundaries (the schedule's "heap read"): the steps
        # after it, to the next one due, may read it once, at their end (lean_steady).
        return rec.index if rec.cuda_start is not None and rec.cuda_peaks else None

    def trace_reader(self) -> Callable[[], int | None] | None:
        return self.allocator.allocated if self._guard.ok(Feature.CUDA) else None

    # -- an ordinary step, read once, at its end (``anatomy.hook.lean``) ----------------------------

    def lean_steady(self) -> bool:
        """One read at an ordinary step's end: True where nothing moved since the last step that read —
        no new process-wide high, the same bytes allocated at the end. Then the step's peak is the last
        one's (same shapes, same allocations); otherwise the step ends the full way."""
        steady = self.steady
        if steady is None or Feature.CUDA in self._guard.off:
            return False
        try:
            allocated, peak = self.allocator.current_and_peak()
        except Exception as exc:
            self._guard.fail(Feature.CUDA, exc)
            return False
        return peak == steady[1] and allocated == steady[2]

    def lean_promoted(self, rec: StepRecord, phase: Phase) -> None:
        """An ordinary step that read nothing became a record in ``phase``: its readings go on from here,
        from the last reading step's start and high. A high passed meanwhile is this step's peak (exact:
        the process-wide peak rose in it), in the phase last measured exactly (the lean step had no
        boundary readings to say which)."""
        steady = self.steady
        if steady is None or Feature.CUDA in self._guard.off:
            return
        try:
            allocated, peak = self.allocator.current_and_peak()
            rec.cuda_start = steady[0]
            if peak > steady[1]:
                known = self.known
                rose_in = known.phase if known is not None else phase
                rec.cuda_peaks.append(PhasePeak(rose_in, peak, exact=True))
            rec.cuda_high = peak
            rec.cuda_phase_start = allocated
            rec.cuda_phase = phase
        except Exception as exc:
            self._guard.fail(Feature.CUDA, exc)

    def lean_finished(self, rec: StepRecord) -> None:
        """A finished ordinary step's record, made afterwards (a rebuild, an OOM record): the readings of
        the step it repeated."""
        steady = self.steady
        if steady is not None and rec.cuda_start is None:
            rec.cuda_start, rec.cuda_high, rec.cuda_phase_start = steady
            rec.cuda_phase = Phase.OTHER
            rec.cuda_peaks.append(PhasePeak(Phase.OTHER, steady[2], exact=False))

    def trace_start(self, rec: StepRecord) -> int | None:
        return rec.cuda_start

    def step_peak(self, rec: StepRecord, start: int) -> tuple[int, Phase, int]:
        """The step's peak, its phase, and the step that measured it exactly."""
        exact = [p for p in rec.cuda_peaks if p.exact]
        traced = self.traced
        if traced is not None and traced.step == rec.index:
            self.known = KnownGrowth(rec.index, traced.growth, traced.phase)
        if exact:
            top = max(exact, key=lambda p: p.value)
            if self.known is None or self.known.step != rec.index or top.value - start > self.known.growth:
                self.known = KnownGrowth(rec.index, top.value - start, top.phase)
        bound = max(rec.cuda_peaks, key=lambda p: p.value)
        known = self.known
        if known is None:
            return bound.value, bound.phase, rec.index
        if known.step == rec.index:
            return start + known.growth, known.phase, rec.index
        # Same shapes, same growth: the last exact figure, within what this step's readings allow.
        peak = min(max(start + known.growth, bound.value), max(rec.cuda_high, bound.value))
        return peak, known.phase, known.step

    def peak(self, rec: StepRecord, parts: StepParts) -> PeakSplit | None:
        start = rec.cuda_start
        if start is None or not rec.cuda_peaks or not self._guard.ok(Feature.CUDA):
            return None
        peak, phase, at_peak_step = self.last_peak = self.step_peak(rec, start)
        traced = self.traced
        if traced is not None and traced.phase is phase:
            held, at_peak_step = traced.held, traced.step
        else:  # no trace of this phase yet: what the phase's boundaries say is held in it
            held = held_in_phase(rec, phase, parts)
        end = rec.cuda_end
        cuda = None
        cache = None
        if end is not None:
            cache = max(end.reserved - end.allocated, 0)
            cuda = CudaMemory(
                allocated=end.allocated,
                reserved=end.reserved,
                peak_allocated=peak,
                alloc_retries=end.alloc_retries,
                ooms=end.ooms,
            )
        return PeakSplit(
            peak=peak,
            phase=phase,
            temporaries=max(peak - start - explained(rec, phase, parts), 0),
            preexisting=max(start - parts.at_start, 0),
            held=held,
            at_peak_step=at_peak_step,
            allocator_cache=cache,
            cuda=cuda,
        )


MemoryBackend = HeapBackend | CudaBackend
# Makes the memory backend for the device the model's parameters are on (a tracker's constructor takes one:
# a test's simulated allocator or counting heap).
BackendFactory = Callable[[torch.device, Guard], MemoryBackend]
