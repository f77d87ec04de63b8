"""The per-op memory trace of a sampled step: memory in use after every aten op, a peak per phase.

Phase-boundary readings miss the peaks inside forward and backward (the temporaries of an op are gone by
the next boundary); reading ``mallinfo2`` (CPU) or the allocator's counter (CUDA) after each op (~5 µs)
sees them. Too slow for every step, the trace runs on a sampled step and its result stands until the
next one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from anatomy.hook.record import Held
from anatomy.vocabulary import Phase


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

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Any other dispatch mode makes Dynamo skip a compiled frame, and torch then runs it eagerly
        # for good; this one reads memory after the ops of compiled code that run through the dispatcher.
        return True

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if not self.failed:
            try:
                now = self._read()
                if now is not None and now > self.peaks.get(self.phase, -1):
                    self.peaks[self.phase] = now
                    held = self._probe() if self._probe is not None else Held()
                    self.moments[self.phase] = Moment(now, held)
            except Exception:  # inside the user's op: never in its way; the trace is dropped instead
                self.failed = True
        return out
