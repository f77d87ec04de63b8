"""Phase durations from a step's marks (the same arithmetic serves CPU clocks and CUDA events)."""

from __future__ import annotations

import pytest

from anatomy.hook.timing import (
    BACKWARD_END,
    BEGIN,
    END,
    FORWARD_POST,
    FORWARD_PRE,
    OPTIMIZER_POST,
    OPTIMIZER_PRE,
    StepClock,
    durations_from_marks,
    usual_marks,
)


def test_two_micro_batches_and_an_optimizer_step() -> None:
    marks = [
        (BEGIN, 0.0),
        (FORWARD_PRE, 0.1),
        (FORWARD_POST, 0.4),  # forward 0.3
        (BACKWARD_END, 1.0),  # backward 0.6 (the Trainer's on_substep_end)
        (FORWARD_PRE, 1.1),  # 0.1 between micro-batches: neither phase
        (FORWARD_POST, 1.3),  # forward 0.2
        (OPTIMIZER_PRE, 1.8),  # backward 0.5
        (OPTIMIZER_POST, 2.0),  # optimizer 0.2
        (END, 2.1),
    ]
    d = durations_from_marks(marks)
    assert d is not None
    assert d.step_s == pytest.approx(2.1)
    assert d.forward_s == pytest.approx(0.5)
    assert d.backward_s == pytest.approx(1.1)
    assert d.optimizer_s == pytest.approx(0.2)


def test_missing_phases_are_unknown_not_zero() -> None:
    d = durations_from_marks([(BEGIN, 0.0), (FORWARD_PRE, 0.1), (FORWARD_POST, 0.3), (END, 0.9)])
    assert d is not None and d.optimizer_s is None  # no optimizer step in this step
    assert d.backward_s == pytest.approx(0.6)  # forward end to step end
    d = durations_from_marks([(BEGIN, 0.0), (END, 0.5)])
    assert d is not None and d.forward_s is None and d.backward_s is None and d.step_s == 0.5
    assert durations_from_marks([(BEGIN, 0.0)]) is None


def test_cpu_clock_is_ready_at_once() -> None:
    clock = StepClock()
    assert not clock.ready()
    for kind in (BEGIN, FORWARD_PRE, FORWARD_POST, END):
        clock.mark(kind)
    assert clock.ready() and clock.kinds == [BEGIN, FORWARD_PRE, FORWARD_POST, END]
    d = clock.durations()
    assert d is not None and d.step_s == pytest.approx(clock.span()) and d.step_s >= 0


def test_a_later_forward_begins_where_the_last_optimizer_step_ended() -> None:
    """Manual optimization (a GAN): the generator's forward after the discriminator's update ends with no
    mark of its start; ``later_forward`` dates it from the update's end, so both cycles' forward and
    backward count (without it the second cycle fell in no phase). Elsewhere it adds nothing."""
    clock = StepClock()
    clock.marks = [(BEGIN, 0.0), (FORWARD_PRE, 0.1), (FORWARD_POST, 0.4), (BACKWARD_END, 1.0)]
    clock.marks += [(OPTIMIZER_PRE, 1.1), (OPTIMIZER_POST, 1.3)]
    clock.later_forward()
    assert clock.kinds[-2:] == [FORWARD_PRE, FORWARD_POST] and clock.marks[-2][1] == 1.3
    clock.marks[-1] = (FORWARD_POST, 1.7)  # the generator's forward: 0.4
    clock.marks += [(BACKWARD_END, 2.5), (OPTIMIZER_PRE, 2.6), (OPTIMIZER_POST, 2.8), (END, 2.9)]
    d = clock.durations()
    assert d is not None
    assert d.forward_s == pytest.approx(0.3 + 0.4)
    assert d.backward_s == pytest.approx(0.6 + 0.8)
    assert d.optimizer_s == pytest.approx(0.2 + 0.2)
    assert d.forward_s + d.backward_s + d.optimizer_s == pytest.approx(d.step_s - 0.1 - 0.1 - 0.1 - 0.1)
    inside = StepClock()
    inside.marks = [(BEGIN, 0.0), (FORWARD_PRE, 0.1)]
    inside.later_forward()  # not after an optimizer step: no mark
    assert inside.kinds == [BEGIN, FORWARD_PRE]


def test_a_cuda_mark_records_on_the_current_stream_made_only_when_it_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Event.record() without a stream builds torch.cuda.current_stream() at every mark; the clock passes
    the stream itself, looked up again only when the device or the current stream's handle changed (this
    CPU build has neither binding: both are stood in for)."""
    import torch

    from anatomy.hook import timing

    where = {"device": 0, "handle": 0}
    made: list[tuple[int, int]] = []

    def current_stream(device: int | None = None) -> tuple[int, int]:
        made.append((where["device"], where["handle"]))
        return made[-1]

    recorded: list[object] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing

        def record(self, stream: object = None) -> None:
            recorded.append(stream)

    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: where["device"], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: where["handle"], raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(timing, "_CURRENT_STREAM", None)
    for _ in range(3):  # three steps of the same stream: one stream object
        clock = timing.StepClock(cuda=True)
        for kind in (timing.BEGIN, timing.FORWARD_PRE, timing.FORWARD_POST, timing.END):
            clock.mark(kind)
    assert made == [(0, 0)] and recorded == [(0, 0)] * 12
    where["handle"] = 7  # the user's `with torch.cuda.stream(side):`
    clock.mark(timing.END)
    where["device"] = 1  # another device's legacy default stream: the same handle, 0, is another stream
    where["handle"] = 0
    clock.mark(timing.END)
    assert made == [(0, 0), (0, 7), (1, 0)] and recorded[-2:] == [(0, 7), (1, 0)]


def test_without_the_bindings_an_event_finds_its_stream_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from anatomy.hook import timing

    recorded: list[object] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            pass

        def record(self, *stream: object) -> None:
            recorded.append(stream)

    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(timing, "_CURRENT_STREAM", None)
    timing.StepClock(cuda=True).mark(timing.BEGIN)
    assert recorded == [()]  # record() with no argument: torch.cuda.current_stream() inside


class _Stream:
    """timing.CurrentStream's surface: the current stream."""

    def get(self) -> str:
        return "the current stream"


def test_torch_own_events_are_recorded_queried_and_timed_through_the_cpp_methods(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from anatomy.hook import timing

    calls: list[tuple[str, object]] = []

    class Base:  # torch._C._CudaEventBase's surface: the C++ methods, what they were called with
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = 0.0

        def record(self, stream: object) -> None:
            calls.append(("record", stream))
            self.t = float(len(calls))

        def query(self) -> bool:
            calls.append(("query", None))
            return True

        def elapsed_time(self, end: Base) -> float:
            calls.append(("elapsed", None))
            return (end.t - self.t) * 1000.0

    class Event(Base):  # torch.cuda.Event: Python methods that only pass on (here: must not be called)
        def record(self, stream: object = None) -> None:
            raise AssertionError("the Python wrapper")

        def query(self) -> bool:
            raise AssertionError("the Python wrapper")

        def elapsed_time(self, end: Base) -> float:
            raise AssertionError("the Python wrapper")

    monkeypatch.setattr(torch._C, "_CudaEventBase", Base, raising=False)
    monkeypatch.setattr(torch.cuda.streams, "Event", Event)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(timing, "_CURRENT_STREAM", _Stream())
    clock = StepClock(cuda=True)
    for kind in timing.USUAL_STEP:
        clock.mark(kind)
    assert calls == [("record", "the current stream")] * 6
    assert clock.span_if_ready() == 5.0 and clock.span_s == 5.0
    d = clock.durations()
    assert d is not None and (d.step_s, d.forward_s, d.backward_s, d.optimizer_s) == (5.0, 1.0, 1.0, 1.0)
    # read once the span is known: no query again, one elapsed time a phase
    assert [c for c, _ in calls[6:]] == ["query", "elapsed", "elapsed", "elapsed", "elapsed"]
    clock.reuse()
    assert clock.span_s is None


@pytest.mark.parametrize(
    "kinds",
    [
        [BEGIN, FORWARD_PRE, FORWARD_POST, OPTIMIZER_PRE, OPTIMIZER_POST, END],
        [BEGIN, FORWARD_PRE, FORWARD_POST, FORWARD_PRE, FORWARD_POST, END],  # six marks, not the usual step
        [BEGIN, FORWARD_PRE, FORWARD_POST, BACKWARD_END, OPTIMIZER_PRE, OPTIMIZER_POST, END],
    ],
)
def test_a_cuda_clock_durations_are_the_marks_durations(
    monkeypatch: pytest.MonkeyPatch, kinds: list[str]
) -> None:
    import torch

    from anatomy.hook import timing

    class Event:  # a stand-in: its time is when it was recorded, in a made-up order
        clock = 0.0

        def __init__(self, enable_timing: bool = False) -> None:
            self.t = 0.0

        def record(self, stream: object = None) -> None:
            Event.clock += 0.25 + len(str(Event.clock)) % 3  # uneven gaps
            self.t = Event.clock

        def query(self) -> bool:
            return True

        def elapsed_time(self, end: Event) -> float:
            return (end.t - self.t) * 1000.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(timing, "_CURRENT_STREAM", _Stream())
    clock = StepClock(cuda=True)
    for kind in kinds:
        clock.mark(kind)
    expected = durations_from_marks([(k, ev.t) for k, ev in clock.marks])
    assert expected is not None and clock.span_if_ready() is not None
    got = clock.durations()
    assert got is not None
    for field in ("step_s", "forward_s", "backward_s", "optimizer_s"):
        want = getattr(expected, field)
        assert getattr(got, field) == (None if want is None else pytest.approx(want)), field
    fresh = StepClock(cuda=True)  # not read through its span first: the same
    fresh.marks, fresh._calls = clock.marks, clock._calls
    assert fresh.durations() == expected  # (by the marks' arithmetic, exactly)


def test_a_usual_steps_marks_in_blocks() -> None:
    """One forward in each block, every block but the last ended at its backward, the update in the last
    (gradient accumulation in blocks); anything else is not the usual step."""
    block = [FORWARD_PRE, FORWARD_POST, BACKWARD_END]
    last = [FORWARD_PRE, FORWARD_POST, OPTIMIZER_PRE, OPTIMIZER_POST, END]
    framework_last = [FORWARD_PRE, FORWARD_POST, BACKWARD_END, OPTIMIZER_PRE, OPTIMIZER_POST, END]
    assert usual_marks([BEGIN, *last], 1) and usual_marks([BEGIN, *framework_last], 1)
    for blocks in (2, 3, 8):
        assert usual_marks([BEGIN, *block * (blocks - 1), *last], blocks)
        assert usual_marks([BEGIN, *block * (blocks - 1), *framework_last], blocks)
        assert not usual_marks([BEGIN, *block * (blocks - 2), *last], blocks)  # (a block short)
        assert not usual_marks([BEGIN, *block * blocks, *last], blocks)  # (a block more)
    two_forwards = [FORWARD_PRE, FORWARD_POST, FORWARD_PRE, FORWARD_POST, BACKWARD_END]
    assert not usual_marks([BEGIN, *two_forwards, *last], 2)
    early_update = [FORWARD_PRE, FORWARD_POST, OPTIMIZER_PRE, OPTIMIZER_POST, BACKWARD_END]
    assert not usual_marks([BEGIN, *early_update, *last], 2)
    assert not usual_marks([*block, *last], 2) and not usual_marks([BEGIN, *block, *last[:-1]], 2)
