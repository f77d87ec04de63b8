"""Phase marks of one training step and the durations they resolve to.

On CPU a mark is a ``perf_counter`` reading. On CUDA it is an event recorded on the current stream;
the durations are read only once the step's last event has completed (``Event.query()``), on a later
step — the hot path never synchronizes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BEGIN = "begin"
FORWARD_PRE = "forward_pre"
FORWARD_POST = "forward_post"
OPTIMIZER_PRE = "optimizer_pre"
OPTIMIZER_POST = "optimizer_post"
BACKWARD_END = "backward_end"  # a micro-batch's backward is done (gradient accumulation)
END = "end"
# The usual step's marks, in order: one forward, then one optimizer step; a framework's usual step
# (Lightning's) also marks its backward's end.
USUAL_STEP = [BEGIN, FORWARD_PRE, FORWARD_POST, OPTIMIZER_PRE, OPTIMIZER_POST, END]
FRAMEWORK_STEP = [BEGIN, FORWARD_PRE, FORWARD_POST, BACKWARD_END, OPTIMIZER_PRE, OPTIMIZER_POST, END]


@dataclass(slots=True)  # (not frozen: a frozen dataclass's __init__ costs a call per field, every step)
class StepDurations:
    step_s: float
    forward_s: float | None
    backward_s: float | None
    optimizer_s: float | None


class CurrentStream:
    """The current CUDA stream, as the object ``Event.record`` takes, made anew only when the current
    device or stream changed. ``Event.record()`` without a stream builds that object on every call
    (``torch.cuda.current_stream()``: device checks and a new ``Stream``), about half of a mark's cost;
    here a mark asks the two C++ bindings for the device and its current stream's handle, and compares.
    Keyed by the device too: the legacy default stream's handle is 0 on every device. None where this
    torch has not the bindings (a CPU build): the event then finds the stream itself."""

    __slots__ = ("_device", "_handle", "_key", "_stream")

    def __init__(self) -> None:
        import torch

        self._device: Any = getattr(torch._C, "_cuda_getDevice", None)
        self._handle: Any = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self._key: tuple[int, int] | None = None
        self._stream: Any = None

    def get(self) -> Any:
        handle = self._handle
        if handle is None:
            return None
        device = self._device()
        key = (device, handle(device))
        if key != self._key:
            import torch

            self._stream = torch.cuda.current_stream(device)
            self._key = key
        return self._stream


_CURRENT_STREAM: CurrentStream | None = None


def current_stream() -> CurrentStream:
    """The process's one ``CurrentStream`` (made at the first CUDA clock)."""
    global _CURRENT_STREAM
    if _CURRENT_STREAM is None:
        _CURRENT_STREAM = CurrentStream()
    return _CURRENT_STREAM


class StepClock:
    """The marks of one step, in the order they happened (``marks``: (kind, time or CUDA event)). On CUDA
    the events it made stay with it: :meth:`reuse` gives it to another step, which records them again."""

    __slots__ = ("_events", "_made", "_stream", "_used", "cuda", "marks")

    def __init__(self, cuda: bool = False) -> None:
        self.cuda = cuda
        self.marks: list[tuple[str, Any]] = []
        self._events: Any = None
        self._stream: CurrentStream | None = None
        self._made: list[tuple[str, Any]] = []  # the marks with CUDA events made so far, in order of use
        self._used = 0  # of those, how many this step recorded
        if cuda:
            import torch

            self._events = torch.cuda.Event
            self._stream = current_stream()

    def reuse(self) -> None:
        """A new step on this clock: no marks, its events to be recorded again (making a CUDA event costs
        more than recording one). Only once nothing reads this clock's events any more."""
        self.marks.clear()
        self._used = 0

    def mark(self, kind: str) -> None:
        if self.cuda:
            made, used = self._made, self._used
            if used < len(made):  # (the mark itself kept too: no object made on a step that reuses)
                mark = made[used]
                if mark[0] != kind:
                    mark = made[used] = (kind, mark[1])
            else:
                mark = (kind, self._events(enable_timing=True))
                made.append(mark)
            self._used = used + 1
            ev = mark[1]
            stream = self._stream.get() if self._stream is not None else None
            if stream is None:
                ev.record()
            else:
                ev.record(stream)
            self.marks.append(mark)
        else:
            self.marks.append((kind, time.perf_counter()))

    def later_forward(self) -> None:
        """A forward no hook saw begin ends now; it began as the step's last optimizer step ended (a GAN's
        generator, run after the discriminator's update)."""
        marks = self.marks
        if marks and marks[-1][0] == OPTIMIZER_POST:
            marks.append((FORWARD_PRE, marks[-1][1]))
            self.mark(FORWARD_POST)

    @property
    def kinds(self) -> list[str]:
        return [k for k, _ in self.marks]

    def ready(self) -> bool:
        """True once every mark can be read without waiting."""
        if not self.marks:
            return False
        if not self.cuda:
            return True
        return bool(self.marks[-1][1].query())

    def span_if_ready(self) -> float | None:
        """``span()`` once ``ready()``, else None: one call on the per-step path."""
        if not self.cuda:
            marks = self.marks
            return float(marks[-1][1] - marks[0][1]) if marks else None
        return self.span() if self.ready() else None

    def span(self) -> float:
        """Seconds from the first mark to the last (call once ready)."""
        first, last = self.marks[0][1], self.marks[-1][1]
        if not self.cuda:
            return float(last - first)
        return float(first.elapsed_time(last)) / 1000.0

    def _seconds(self) -> list[tuple[str, float]]:
        if not self.cuda:
            return list(self.marks)
        first = self.marks[0][1]
        return [(k, 0.0 if ev is first else first.elapsed_time(ev) / 1000.0) for k, ev in self.marks]

    def durations(self) -> StepDurations | None:
        """None until ready. Backward is from each forward's end to the next forward, the optimizer
        step or the step's end (so it includes the loss and ``backward()`` of every micro-batch)."""
        if not self.cuda:
            return durations_from_marks(self.marks)  # (host times: read in place)
        if not self.ready():
            return None
        return durations_from_marks(self._seconds())


# Makes a step's clock, given whether it can time the step on the device (CUDA events): the class itself,
# unless a tracker's constructor is given another (a test's fake events).
ClockFactory = Callable[[bool], StepClock]

# Clocks of ordinary CUDA steps in the ring: more than the throughput's queue holds (64 waiting, the newest
# read, the step in progress), so a clock taken again has been read or dropped by then.
RING = 72


class ClockRing:
    """The device clocks of ordinary (lean) CUDA steps, each made once and taken again every ``RING``
    steps with its events (:meth:`StepClock.reuse`)."""

    __slots__ = ("_clocks", "_factory", "_next")

    def __init__(self, factory: ClockFactory) -> None:
        self._factory = factory
        self._clocks: list[StepClock] = []
        self._next = 0

    def take(self) -> StepClock:
        i = self._next
        self._next = i + 1 if i + 1 < RING else 0
        clocks = self._clocks
        if i < len(clocks):
            clock = clocks[i]
            clock.reuse()
            return clock
        clock = self._factory(True)
        clocks.append(clock)
        return clock


def durations_from_marks(marks: list[tuple[str, float]]) -> StepDurations | None:
    if len(marks) < 2:
        return None
    fwd = bwd = opt = 0.0
    saw_fwd = saw_opt = False
    fwd_start: float | None = None
    bwd_start: float | None = None
    opt_start: float | None = None
    for kind, t in marks:
        if kind == FORWARD_PRE:
            if bwd_start is not None:
                bwd += t - bwd_start
                bwd_start = None
            if opt_start is not None:  # a closure's forward inside the optimizer step (LBFGS, Lightning)
                opt += t - opt_start
                saw_opt = True
                opt_start = None
            fwd_start = t
        elif kind == FORWARD_POST and fwd_start is not None:
            fwd += t - fwd_start
            saw_fwd = True
            fwd_start = None
            bwd_start = t
        elif kind == OPTIMIZER_PRE:
            if bwd_start is not None:
                bwd += t - bwd_start
                bwd_start = None
            if opt_start is None:
                opt_start = t
        elif kind == OPTIMIZER_POST and opt_start is not None:
            opt += t - opt_start
            saw_opt = True
            opt_start = None
        elif kind in (END, BACKWARD_END) and bwd_start is not None:
            bwd += t - bwd_start
            bwd_start = None
    step = marks[-1][1] - marks[0][1]
    return StepDurations(
        step_s=max(step, 0.0),
        forward_s=fwd if saw_fwd else None,
        backward_s=bwd if saw_fwd else None,
        optimizer_s=opt if saw_opt else None,
    )
