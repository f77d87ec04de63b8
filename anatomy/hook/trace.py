"""The per-op memory trace of a sampled step: memory in use after every aten op, a peak per phase.

Phase-boundary readings miss the peaks inside forward and backward (the temporaries of an op are gone by
the next boundary); reading ``mallinfo2`` (CPU) or the allocator's counter (CUDA) after each op (~5 µs)
sees them. Too slow for every step, the trace runs on a sampled step and its result stands until the
next one.

A read is not always cheap: ``mallinfo2`` walks glibc's arenas, ~0.2 ms on a large model's heap, where a
big model runs tens of thousands of ops a step. So the trace keeps its reads within the step's own time
so far (``READ_SHARE``; for a piece's trace, the whole step's): while reading has cost more than that
share, it reads after every second op, then every fourth... (``stride``), and back down when there is
room. A traced step then takes at most about twice its usual time; on a big model the trace samples its
ops (``stride`` > 1) and may miss a transient peak between two reads (the boundary readings still bound
the peak from below) — except where the peak may be (``MemoryTrace._read_anyway``): after an op whose result
is large next to how far memory has moved in the step (a load that slowed the reads once left a QLoRA Llama's
traced peak 1 MiB, 17%, low by skipping the op that made its logits' loss temporaries), and past the forward,
wherever what the skipped ops allocated could have lifted memory above the step's highest reading (a 32-layer
tiny Llama with the stride forced to its most: the peak 2.4% low before, exact after, in 500 reads where every
op's read is 3,690).

Only an op that can allocate is read after: one with a result that is not an alias of its inputs by its
schema (views — ``view``, ``t``, ``expand`` — in-place and ``out=`` ops allocate no tensor memory; the heap
can only have gone down since the last read, by what the Python between the ops freed). About half of a
transformer step's ops are such (a tiny Llama: 383 of 718), and a read of a large heap costs more than
most of them; the first op of each phase is read whatever it is, so every phase has its reading.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from anatomy.hook.held import Held
from anatomy.hook.saved_values import tensors_in
from anatomy.vocabulary import Phase

READ_SHARE = 1.0  # the trace's reads may take at most this share of the traced step's other time
MAX_STRIDE = 1 << 16
# Reads after every op before the stride may change: the first ops (views, small ones) say little about
# the step's pace, and a small model's whole trace stays exact — up to this much time reading (a big
# model's heap takes ~1 ms a read).
GRACE_READS = 512
GRACE_S = 0.02


# A result of at least 1/LARGE_SHARE of how far memory moved in the step so far is read after whatever the
# stride (MemoryTrace._large).
LARGE_SHARE = 8


# Per op seen (keyed by id, the op kept in the entry): whether it can allocate (see the module's docstring).
_ALLOCATES: dict[int, tuple[Any, bool]] = {}


def _allocates(func: Any) -> bool:
    try:
        # (a result aliased by the schema allocates nothing, except where the op resizes or sets storage:
        # resize_, set_, and an out= overload given a tensor of another size)
        name = str(func)
        allocates = (
            any(r.alias_info is None for r in func._schema.returns)
            or "resize" in name
            or ".set_." in name
            or str(getattr(func, "_overloadname", "")).startswith("out")
        )
    except Exception:  # (no schema to tell: read after it)
        allocates = True
    if len(_ALLOCATES) < 8192:
        _ALLOCATES[id(func)] = (func, allocates)
    return allocates


@dataclass(frozen=True, slots=True)
class Moment:
    """One reading of the trace with what the named tensors held at that moment (optimizer states
    are not probed per op: the tracker knows them per phase)."""

    reading: int  # heap in use (CPU) / allocated (CUDA)
    held: Held


class MemoryTrace(TorchDispatchMode):
    """Memory in use after every op, kept as a peak per phase (``peaks``) with what the named
    tensors held at that peak's moment (``moments``). The tracker sets ``phase`` at each boundary;
    ``probe`` returns what the named tensors hold now."""

    def __init__(self, read: Callable[[], int | None], probe: Callable[[], Held] | None = None) -> None:
        super().__init__()
        self._read = read
        self._probe = probe
        self.phase = Phase.OTHER
        self.peaks: dict[Phase, int] = {}
        self.moments: dict[Phase, Moment] = {}
        self.failed = False
        self.stride = 1  # read after every ``stride``-th op that may allocate (see the module's docstring)
        self.ops = 0  # ops that may allocate, or a phase's first
        self._read_phase: Phase | None = None  # the phase of the last read
        self.reads = 0
        self.spent_s = 0.0  # time spent reading
        self._began = perf_counter()
        self._low = 1 << 62  # the lowest and highest readings so far: how far memory moves in this step
        self._high = 0
        self._last = 0  # the last reading
        self._pending = 0  # bytes of the results of the ops skipped since

    def _read_anyway(self, out: Any) -> bool:
        """Read after this op although the stride would skip it, where the step's peak may be at it:
        - its result is large next to how far memory has moved in the step so far (``LARGE_SHARE``): a
          transient that large (a model's logits, its loss's temporaries) is where a small model's peak is,
          and skipped, the peak reads low by its size;
        - past the forward, what the ops skipped since the last read allocated could have lifted memory
          above the step's highest reading (their results' bytes, an upper bound: frees only lower it). In
          the forward memory climbs with every op, so this would read after all of them; there the next
          phase's first reading sees where the climb ended."""
        try:
            nbytes = sum(t.nbytes for t in tensors_in(out))  # (an aten op's result: a tensor, or a tuple)
        except Exception:  # (a result of a kind never seen: the stride decides)
            return False
        self._pending += nbytes
        return self._large(nbytes) or self._may_top()

    def _large(self, nbytes: int) -> bool:
        span = self._high - self._low
        return span > 0 and nbytes * LARGE_SHARE >= span

    def _may_top(self) -> bool:
        return self.phase is not Phase.FORWARD and self._last + self._pending > self._high

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Any other dispatch mode makes Dynamo skip a compiled frame, and torch then runs it eagerly
        # for good; this one reads memory after the ops of compiled code that run through the dispatcher.
        return True

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.failed:
            return out
        known = _ALLOCATES.get(id(func))
        if not (known[1] if known is not None else _allocates(func)) and self.phase is self._read_phase:
            return out  # (nothing allocated: the heap can only have gone down since the last read)
        self.ops += 1
        if self.ops % self.stride and not self._read_anyway(out):
            return out
        try:
            self._read_phase = self.phase
            began = perf_counter()
            now = self._read()
            if now is not None:
                if now > self.peaks.get(self.phase, -1):
                    self.peaks[self.phase] = now
                    held = self._probe() if self._probe is not None else Held()
                    self.moments[self.phase] = Moment(now, held)
                if now < self._low:
                    self._low = now
                if now > self._high:
                    self._high = now
                self._last = now
                self._pending = 0
            done = perf_counter()
            self.reads += 1
            self.spent_s += done - began
            # The step's own time so far (ops and the Python between them). Counting the ops' time alone
            # left a small model's trace few reads (its step is mostly Python): a LoRA Llama's peak read
            # 13.5% low under load, where the step's time bounds the delay all the same.
            rest = done - self._began - self.spent_s
            if self.reads < GRACE_READS and self.spent_s < GRACE_S:  # every op, until the pace can be told
                pass
            elif self.spent_s > READ_SHARE * rest and self.stride < MAX_STRIDE:
                self.stride *= 2
            elif self.stride > 1 and self.spent_s < 0.25 * READ_SHARE * rest:
                self.stride //= 2
        except Exception:  # inside the user's op: never in its way; the trace is dropped instead
            self.failed = True
        return out
