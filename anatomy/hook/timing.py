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


def usual_marks(kinds: list[str], blocks: int) -> bool:
    """Are ``kinds`` a usual step's marks, in ``blocks`` step blocks? Under gradient accumulation in blocks,
    each block but the last is one forward ended at its backward (a block without an update), and the last
    is a usual step's."""
    if blocks == 1:
        return kinds in (USUAL_STEP, FRAMEWORK_STEP)
    accumulated = 1 + 3 * (blocks - 1)
    head = kinds[:accumulated]
    if head[1:] != [FORWARD_PRE, FORWARD_POST, BACKWARD_END] * (blocks - 1):
        return False
    return [BEGIN, *kinds[accumulated:]] in (USUAL_STEP, FRAMEWORK_STEP) and head[:1] == [BEGIN]


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


class EventCalls:
    """How a clock records, queries and times its CUDA events: torch's C++ methods themselves where the
    events are torch's own (``torch.cuda.Event``'s Python methods only pass their arguments on, a frame
    each, 9-11 calls a step), else the events' own methods (a test's stand-ins)."""

    __slots__ = ("elapsed", "query", "record")

    def __init__(self, events: Any) -> None:
        import torch

        base = getattr(torch._C, "_CudaEventBase", None)
        real = getattr(getattr(torch.cuda, "streams", None), "Event", None)
        if base is not None and events is real and isinstance(events, type) and issubclass(events, base):
            self.record: Callable[..., Any] = base.record
            self.query: Callable[[Any], bool] = base.query
            self.elapsed: Callable[[Any, Any], float] = base.elapsed_time
        else:
            self.record = _record
            self.query = _query
            self.elapsed = _elapsed


def _record(event: Any, stream: Any = None) -> None:
    if stream is None:
        event.record()
    else:
        event.record(stream)


def _query(event: Any) -> bool:
    return bool(event.query())


def _elapsed(start: Any, end: Any) -> float:
    return float(start.elapsed_time(end))


class StepClock:
    """The marks of one step, in the order they happened (``marks``: (kind, time or CUDA event)). On CUDA
    the events it made stay with it: :meth:`reuse` gives it to another step, which records them again."""

    __slots__ = ("_calls", "_events", "_made", "_stream", "_used", "cuda", "marks", "span_s")

    def __init__(self, cuda: bool = False) -> None:
        self.cuda = cuda
        self.marks: list[tuple[str, Any]] = []
        self._events: Any = None
        self._stream: CurrentStream | None = None
        self._calls: EventCalls | None = None
        self._made: list[tuple[str, Any]] = []  # the marks with CUDA events made so far, in order of use
        self._used = 0  # of those, how many this step recorded
        self.span_s: float | None = None  # on CUDA: the first mark to the last, once read (span_if_ready)
        if cuda:
            import torch

            self._events = torch.cuda.Event
            self._stream = current_stream()
            self._calls = EventCalls(self._events)

    def reuse(self) -> None:
        """A new step on this clock: no marks, its events to be recorded again (making a CUDA event costs
        more than recording one). Only once nothing reads this clock's events any more."""
        self.marks.clear()
        self._used = 0
        self.span_s = None

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
            stream = self._stream.get() if self._stream is not None else None
            self._calls.record(mark[1], stream)  # type: ignore[union-attr]
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
        return self._calls.query(self.marks[-1][1])  # type: ignore[union-attr]

    def span_if_ready(self) -> float | None:
        """``span()`` once ``ready()``, else None: one call on the per-step path (on CUDA kept as
        ``span_s``, which :meth:`durations` then takes rather than asking again)."""
        marks = self.marks
        if not self.cuda:
            return float(marks[-1][1] - marks[0][1]) if marks else None
        if not marks:
            return None
        calls = self._calls
        last = marks[-1][1]
        if not calls.query(last):  # type: ignore[union-attr]
            return None
        span = self.span_s = calls.elapsed(marks[0][1], last) / 1000.0  # type: ignore[union-attr]
        return span

    def span(self) -> float:
        """Seconds from the first mark to the last (call once ready)."""
        first, last = self.marks[0][1], self.marks[-1][1]
        if not self.cuda:
            return float(last - first)
        return self._calls.elapsed(first, last) / 1000.0  # type: ignore[union-attr]

    def _seconds(self) -> list[tuple[str, float]]:
        if not self.cuda:
            return list(self.marks)
        first = self.marks[0][1]
        elapsed = self._calls.elapsed  # type: ignore[union-attr]
        return [(k, 0.0 if ev is first else elapsed(first, ev) / 1000.0) for k, ev in self.marks]

    def durations(self) -> StepDurations | None:
        """None until ready. Backward is from each forward's end to the next forward, the optimizer
        step or the step's end (so it includes the loss and ``backward()`` of every micro-batch)."""
        if not self.cuda:
            return durations_from_marks(self.marks)  # (host times: read in place)
        span = self.span_s
        if span is None and not self.ready():
            return None
        marks = self.marks
        if span is not None and len(marks) == 6:
            # The usual step's six marks: each phase is one elapsed time (durations_from_marks's sums for
            # this order), the step the span already read.
            (_, _), (k1, fpre), (k2, fpost), (k3, opre), (k4, opost), (_, _) = marks
            if k1 is FORWARD_PRE and k2 is FORWARD_POST and k3 is OPTIMIZER_PRE and k4 is OPTIMIZER_POST:
                elapsed = self._calls.elapsed  # type: ignore[union-attr]
                return StepDurations(
                    max(span, 0.0),
                    elapsed(fpre, fpost) / 1000.0,
                    elapsed(fpost, opre) / 1000.0,
                    elapsed(opre, opost) / 1000.0,
                )
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
