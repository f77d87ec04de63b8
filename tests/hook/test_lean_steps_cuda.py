"""The ordinary step's O(1) path on CUDA (anatomy.hook.lean, CudaBackend.lean_steady): the step's events go
to the throughput's queue in order with every other step's, and the allocator is read once, at its end.
Driven on CPU by stand-ins for CUDA events (completed at once) and for the caching allocator's statistics —
an allocator whose "allocated" is a deterministic count of the ops of the step so far, so that a run with
the O(1) path and one without it read the same numbers: then every snapshot but its times comes out the
same, a step that sets a new high included."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import anatomy
from anatomy.hook import ordinary
from anatomy.hook.backend import CudaBackend
from anatomy.hook.cuda import CudaAllocator
from anatomy.hook.guard import Guard
from anatomy.hook.lean import BEGUN, FORWARD_DONE, UPDATED
from anatomy.hook.ordinary import OrdinarySteps
from anatomy.hook.record import StepRecord
from anatomy.hook.timing import BEGIN, END, FORWARD_POST, FORWARD_PRE, RING, USUAL_STEP, EventCalls, StepClock
from anatomy.hook.tracker import Tracker
from anatomy.vocabulary import Phase
from tests.hook.cuda_standins import nested_stats

BASE = 10_000_000  # allocated before a step: the model, its gradients and optimizer state, in this stand-in
H100 = "NVIDIA H100 80GB HBM3"
PER_OP = 1_000
FRAMEWORK_STEPS = 6  # each op of a step leaves this much more allocated until the step is over
_PER_RUN = ("seq", "time", "timing", "suggestions", "achieved_tflops", "mfu")


class OpCountingAllocator(TorchDispatchMode):
    """The caching allocator's counters as a function of the ops run since the step began: deterministic,
    the same in every run of the same steps. ``reads``: how many times the hook read it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.peak = BASE
        self.reads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        self.peak = max(self.peak, BASE + PER_OP * self.ops)
        return func(*args, **(kwargs or {}))

    def new_step(self) -> None:
        self.ops = 0  # what the step allocated is freed as it ends

    def memory_stats_as_nested_dict(self, device: Any = None) -> dict[str, Any]:
        self.reads += 1
        now = BASE + PER_OP * self.ops
        return nested_stats(now, self.peak, reserved=self.peak + 4096)


class CompletedEvent:
    """torch.cuda.Event's surface, completed as soon as recorded (unless the device is held back:
    ``lagging``); ``made`` and ``recorded`` count the events made and the records."""

    made = recorded = 0
    lagging = False

    def __init__(self, enable_timing: bool = False) -> None:
        CompletedEvent.made += 1
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        CompletedEvent.recorded += 1
        self.t = time.perf_counter()

    def query(self) -> bool:
        return not CompletedEvent.lagging

    def elapsed_time(self, end: CompletedEvent) -> float:
        return (end.t - self.t) * 1000.0


def _stand_ins(monkeypatch: pytest.MonkeyPatch, every_s: float = 0.0) -> OpCountingAllocator:
    """CUDA's stand-ins; ``every_s``: how long after a step the device timed the next one is timed (0.0:
    every step, as these tests compare the lean way with the full one step by step)."""
    monkeypatch.setattr(ordinary, "DEVICE_EVERY_S", every_s)
    monkeypatch.setattr(torch.cuda, "Event", CompletedEvent)
    alloc = OpCountingAllocator()
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", alloc.memory_stats_as_nested_dict)
    props = SimpleNamespace(name=H100, total_memory=80 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: H100)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: props)
    use_device = Tracker._use_device

    def as_on_cuda(self: Tracker, device: torch.device) -> None:
        use_device(self, device)
        self._cuda_events = True  # the CPU model's steps timed as a CUDA device's are: with events

    monkeypatch.setattr(Tracker, "_use_device", as_on_cuda)
    return alloc


def _on_cuda(device: torch.device, guard: Guard) -> CudaBackend:
    return CudaBackend(CudaAllocator(torch.device("cuda", 0)), guard)


def _events(cuda: bool) -> StepClock:
    return StepClock(cuda=True)  # the CPU model's steps timed with (stand-in) CUDA events


def _tracker(model: torch.nn.Module, opt: torch.optim.Optimizer) -> anatomy.Tracker:
    backend, clock = _on_cuda, _events
    return anatomy.Tracker(
        model, opt, publish=False, sample_every=0, interval_s=3600.0, memory_backend=backend, step_clock=clock
    )


def _usual(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, extra: int = 0) -> None:
    y = model(x)
    for _ in range(extra):  # a step that allocates more than the others: a new high
        y = y * 1.0
    y.sum().backward()
    opt.step()
    opt.zero_grad()


CLOSURE_STEP = [-1]  # the index of _run's step whose optimizer takes a closure
BLOCK_STEPS: list[int] = []  # the indices of _run's steps of two blocks (gradient accumulation)


def _run(
    lean: bool, monkeypatch: pytest.MonkeyPatch, every_s: float = 0.0, told: bool = False
) -> tuple[list[dict[str, Any]], OpCountingAllocator]:
    """Steps of every kind; ``told``: the usual ones told their samples (so that they may rest)."""
    monkeypatch.setattr(ordinary, "ORDINARY_IN_O1", lean)
    alloc = _stand_ins(monkeypatch, every_s)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = _tracker(model, opt)
    x, wide = torch.randn(8, 16), torch.randn(12, 16)

    def step(body: Callable[[], None], samples: int = 8) -> None:
        alloc.new_step()
        with alloc, tracker.step(samples=samples if told else None):
            body()

    for _ in range(8):
        step(lambda: _usual(model, opt, x))
    step(lambda: _usual(model, opt, x, extra=6))  # a new high on a step the lean path began
    for _ in range(4):
        step(lambda: _usual(model, opt, x))
    step(lambda: _usual(model, opt, wide), 12)  # a new batch shape
    for _ in range(4):
        step(lambda: _usual(model, opt, x))

    def two_forwards() -> None:
        model(x).sum().backward()
        _usual(model, opt, x)

    step(two_forwards, 16)
    for _ in range(4):
        step(lambda: _usual(model, opt, x))
    for _ in range(3):  # gradient accumulation: every step two forwards
        step(two_forwards, 16)
    for _ in range(3):
        step(lambda: _usual(model, opt, x))
    BLOCK_STEPS.clear()
    for _ in range(6):  # gradient accumulation in blocks: two micro-batches a step, a block each
        BLOCK_STEPS.append(tracker._steps_done)
        alloc.new_step()
        with alloc, tracker.step(samples=8 if told else None):
            model(x).sum().backward()
        with alloc, tracker.step(samples=8 if told else None):
            _usual(model, opt, x)
    for _ in range(3):
        step(lambda: _usual(model, opt, x))

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    def closure_step() -> None:
        opt.step(closure)
        opt.zero_grad()

    CLOSURE_STEP[0] = tracker._steps_done
    step(closure_step)
    for _ in range(3):
        step(lambda: _usual(model, opt, x))
    alloc.new_step()
    with alloc, tracker.step():  # a block without an update: the step goes on in the next one
        model(x).sum().backward()
    step(lambda: _usual(model, opt, x))
    try:
        alloc.new_step()
        with alloc, tracker.step():
            model(x).sum().backward()
            raise ValueError("the user's own")
    except ValueError:
        opt.zero_grad()
    for _ in range(3):
        step(lambda: _usual(model, opt, x))
    for _ in range(3):  # the Hugging Face Trainer's calls around the optimizer's own hooks
        alloc.new_step()
        with alloc:
            tracker.begin_step()
            model(x).sum().backward()
            tracker.optimizer_begin()
            opt.step(closure=None)
            tracker.optimizer_end()
            opt.zero_grad()
            tracker.end_step()
    for _ in range(FRAMEWORK_STEPS):  # Lightning's automatic optimization, its calls made by hand
        alloc.new_step()
        with alloc:
            tracker.begin_step(8)
            tracker.forward_begin(x)

            def training_step() -> torch.Tensor:
                loss = model(x).sum()  # (the model's own forward, nested in the framework's)
                tracker.backward_begin()
                loss.backward()
                tracker.backward_end()
                return loss

            opt.step(training_step)
            opt.zero_grad()
            tracker.forward_end()
            tracker.end_step()
    history = [
        {k: v for k, v in dataclasses.asdict(snap).items() if k not in _PER_RUN} for snap in tracker.history
    ]
    timed = [snap.timing for snap in tracker.history]
    tracker.close()
    assert all(t.step_s and t.forward_s for t in timed[1:])  # read from the events
    return history, alloc


@pytest.mark.parametrize("every_s", [0.0, 3600.0], ids=["every-step-timed", "one-step-timed"])
def test_cuda_steps_come_out_as_the_full_way_makes_them(
    monkeypatch: pytest.MonkeyPatch, every_s: float
) -> None:
    full, full_alloc = _run(False, monkeypatch)
    promoted: dict[int, int] = {}
    real = OrdinarySteps._promote

    def spy(self: Any) -> StepRecord:
        promoted[self._lean.index] = self._lean.stage
        return real(self)

    monkeypatch.setattr(OrdinarySteps, "_promote", spy)
    lean, lean_alloc = _run(True, monkeypatch, every_s)
    assert [s["step"] for s in lean] == [s["step"] for s in full] == list(range(len(full)))
    for a, b in zip(lean, full, strict=True):
        assert a == b, a["step"]
    peaks = [s["peak_bytes"] for s in lean]
    assert peaks[8] > peaks[7]  # the high of step 8 is its own (and stands, as the full way has it)
    assert all(s["error"] is None for s in lean)
    assert lean[8]["peak_phase"] == full[8]["peak_phase"]
    assert promoted.get(8) == UPDATED  # the new high, seen by the one read at its end
    assert promoted.get(13) == BEGUN  # the new batch shape, at its forward: read from there as in full
    assert promoted.get(18) == FORWARD_DONE  # the second forward
    assert lean_alloc.reads < 0.6 * full_alloc.reads  # one read per ordinary step, not one per phase
    framework = set(range(len(lean) - FRAMEWORK_STEPS + 2, len(lean)))  # (after one that reads in full)
    assert not framework & set(promoted)  # Lightning's usual steps: lean on CUDA too


def test_an_ordinary_cuda_step_reads_once_and_records_six_events(monkeypatch: pytest.MonkeyPatch) -> None:
    alloc = _stand_ins(monkeypatch)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = _tracker(model, opt)
    x = torch.randn(8, 16)
    for _ in range(6):
        alloc.new_step()
        with alloc, tracker.step():
            _usual(model, opt, x)
    made: list[int] = []
    real_init = StepRecord.__init__

    def counting_init(self: StepRecord, *args: Any, **kwargs: Any) -> None:
        made.append(args[0] if args else kwargs["index"])
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(StepRecord, "__init__", counting_init)
    reads, events = alloc.reads, CompletedEvent.recorded
    for _ in range(20):
        alloc.new_step()
        with alloc, tracker.step():
            _usual(model, opt, x)
    snap = tracker.latest
    queue_empty = not tracker.throughput.pending
    tracker.close()
    assert made == []
    assert alloc.reads - reads == 20  # one allocator read a step, at its end
    assert CompletedEvent.recorded - events == 20 * 6  # begin, forward start and end, optimizer both, end
    assert snap is not None and snap.step == 25 and queue_empty
    assert snap.timing.step_s and snap.timing.forward_s and snap.timing.backward_s and snap.timing.optimizer_s
    assert snap.timing.samples_per_s == pytest.approx(8 / snap.timing.step_s)
    assert snap.peak_bytes == alloc.peak  # the usual step's peak: the process-wide one, never exceeded


def test_the_backend_read_once_at_an_ordinary_steps_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """lean_steady: no new high and the same bytes at the end; lean_promoted: a new high is the step's
    peak, exact, in the phase last measured; lean_finished: a finished lean step's record repeats the
    last readings."""
    values = {"current": 5_000, "peak": 9_000}
    monkeypatch.setattr(
        torch.cuda,
        "memory_stats_as_nested_dict",
        lambda device=None: nested_stats(values["current"], values["peak"], reserved=10_000),
    )
    guard = Guard()
    backend = CudaBackend(CudaAllocator(torch.device("cuda", 0)), guard)
    assert not backend.lean_steady()  # nothing read in full yet

    def read_step(index: int, micro: int = 1, closure: bool = False) -> StepRecord:
        rec = StepRecord(index, False, None, None, StepClock(False))
        rec.micro, rec.closure = micro, closure
        rec.clock.marks = [(kind, 0.0) for kind in USUAL_STEP]
        for phase in (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER):
            backend.phase_ends(rec, phase)
        backend.step_ends(rec, stats_due=True)
        return rec

    read_step(0, closure=True)  # its start read in the closure, after the optimizer began: not repeated
    assert backend.steady is None and not backend.lean_steady()
    read_step(1, micro=2)  # two forwards
    assert backend.steady is None
    read_step(2)
    assert backend.steady == (5_000, 9_000, 5_000)
    assert backend.lean_steady()
    values["current"] = 5_100  # left more allocated than the last step
    assert not backend.lean_steady()
    values["current"], values["peak"] = 5_000, 9_500  # a new high
    assert not backend.lean_steady()
    backend.known = None
    promoted = StepRecord(1, False, None, None, StepClock(False))
    promoted.micro, promoted.clock.marks = 1, [(kind, 0.0) for kind in USUAL_STEP]  # (at its end)
    backend.lean_promoted(promoted, Phase.OTHER)
    assert promoted.cuda_start == 5_000 and promoted.cuda_high == 9_500
    assert [(p.phase, p.value, p.exact) for p in promoted.cuda_peaks] == [(Phase.OTHER, 9_500, True)]
    backend.step_ends(promoted, stats_due=False)
    assert backend.step_peak(promoted, 5_000)[0] == 9_500
    finished = StepRecord(2, False, None, None, StepClock(False))
    backend.lean_finished(finished)
    assert (finished.cuda_start, finished.cuda_high) == (5_000, 9_500)
    assert backend.peak(finished, _parts(finished)) is not None


def _parts(rec: StepRecord) -> Any:
    from anatomy.hook.record import Sums
    from anatomy.hook.split import step_parts

    return step_parts(rec, Sums())


def test_ordinary_cuda_steps_record_the_same_events_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Making a CUDA event costs more than recording one: an ordinary step's clock comes from a ring of
    RING, its events made once. A device that falls behind by more than the ring (its events not done)
    loses those steps' times, never the later ones."""
    alloc = _stand_ins(monkeypatch)
    CompletedEvent.lagging = False
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = _tracker(model, opt)
    x = torch.randn(8, 16)

    def steps(n: int) -> None:
        for _ in range(n):
            alloc.new_step()
            with alloc, tracker.step():
                _usual(model, opt, x)

    steps(6)
    made = CompletedEvent.made
    steps(RING)
    first_lap = CompletedEvent.made - made
    steps(RING + 10)
    assert first_lap <= 6 * RING and CompletedEvent.made - made == first_lap  # none made on the second lap
    CompletedEvent.lagging = True  # the device falls behind: nothing can be read for two laps
    steps(2 * RING)
    assert tracker.throughput.pending <= 65
    stale = tracker.throughput.timing_step
    CompletedEvent.lagging = False
    steps(3)
    snap = tracker.latest
    tracker.close()
    assert stale is not None and stale < 6 + 2 * RING + 10
    assert tracker.throughput.timing_step == snap.step == 6 + 4 * RING + 10 + 2  # caught up: the newest
    assert snap.timing.step_s and snap.timing.forward_s and snap.error is None


def test_a_clock_used_again_records_its_own_events_again() -> None:
    clock = StepClock(cuda=False)
    clock.cuda, clock._events, clock._stream = True, CompletedEvent, None
    clock._calls = EventCalls(CompletedEvent)
    for kind in (BEGIN, FORWARD_PRE, FORWARD_POST, END):
        clock.mark(kind)
    events = [ev for _, ev in clock.marks]
    clock.reuse()
    assert clock.marks == []
    clock.mark(BEGIN)
    clock.later_forward()  # (no optimizer step before it: nothing)
    for kind in (FORWARD_PRE, FORWARD_POST, END, END):
        clock.mark(kind)
    again = [ev for _, ev in clock.marks]
    assert again[:4] == events and again[4] not in events  # the fifth mark: a new event, kept from then on
    assert len({id(ev) for ev in again}) == 5


def _steps(tracker: anatomy.Tracker, alloc: OpCountingAllocator, n: int, extra: int = 0) -> None:
    model, opt = tracker.model, tracker._optimizer
    assert opt is not None
    x = torch.randn(8, 16)
    for _ in range(n):
        alloc.new_step()
        with alloc, tracker.step():
            _usual(model, opt, x, extra)


def _small() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def test_ordinary_cuda_steps_between_timed_ones_record_no_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step records its events only where DEVICE_EVERY_S passed since the last step that did; the others
    read the allocator once, as every ordinary step does, and their rows carry the newest device times."""
    alloc = _stand_ins(monkeypatch, every_s=3600.0)
    model, opt = _small()
    tracker = _tracker(model, opt)
    _steps(tracker, alloc, 6)  # (the first ordinary step among them timed: none before it was)
    before, timed_step = tracker.latest, tracker.throughput.timing_step
    reads, events = alloc.reads, CompletedEvent.recorded
    _steps(tracker, alloc, 20)
    untimed = tracker.latest
    assert CompletedEvent.recorded == events  # no event on the 20 steps
    assert alloc.reads - reads == 20  # the memory still read at every step's end
    assert before is not None and untimed is not None and untimed.step == before.step + 20
    assert untimed.timing == before.timing and tracker.throughput.timing_step == timed_step
    tracker._device_due = 0.0  # as if the time had passed
    _steps(tracker, alloc, 3)
    snap = tracker.latest
    tracker.close()
    assert CompletedEvent.recorded - events == 6  # one step timed: its six marks
    assert snap is not None and tracker.throughput.timing_step == untimed.step + 1
    assert snap.timing != before.timing and snap.timing.step_s and snap.timing.forward_s


def test_a_promoted_step_the_device_did_not_time_keeps_the_device_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An untimed ordinary step that becomes a record (a new high) goes the full way on the host clock: its
    host times (launches, not the device's work) are never published as the step's times."""
    alloc = _stand_ins(monkeypatch, every_s=3600.0)
    model, opt = _small()
    tracker = _tracker(model, opt)
    _steps(tracker, alloc, 6)
    before, timed_step = tracker.latest, tracker.throughput.timing_step
    _steps(tracker, alloc, 1, extra=6)  # a new high: seen at the end, the step promoted
    high = tracker.latest
    _steps(tracker, alloc, 2)
    tracker.close()
    assert before is not None and high is not None and high.peak_bytes > before.peak_bytes
    assert high.step == before.step + 1 and high.timing == before.timing
    assert tracker.throughput.timing_step == timed_step


def test_ordinary_cuda_steps_are_timed_about_every_device_every_s(monkeypatch: pytest.MonkeyPatch) -> None:
    alloc = _stand_ins(monkeypatch, every_s=0.02)
    model, opt = _small()
    tracker = _tracker(model, opt)
    _steps(tracker, alloc, 6)
    events, steps = CompletedEvent.recorded, 0
    began = time.perf_counter()
    while time.perf_counter() - began < 0.3:
        _steps(tracker, alloc, 1)
        steps += 1
    elapsed = time.perf_counter() - began
    tracker.close()
    timed = (CompletedEvent.recorded - events) / 6
    assert timed == int(timed) and 1 <= timed <= elapsed / 0.02 + 1
    assert timed < steps / 2


@pytest.mark.parametrize("every_s", [0.0, 3600.0], ids=["every-step-timed", "one-step-timed"])
def test_cuda_steps_told_their_samples_rest_and_come_out_as_the_full_way_makes_them(
    monkeypatch: pytest.MonkeyPatch, every_s: float
) -> None:
    full, full_alloc = _run(False, monkeypatch, told=True)
    rested: list[int] = []
    real = OrdinarySteps._end_ordinary

    def spy(self: Any, *args: Any) -> bool:
        ended = real(self, *args)
        if ended and len(args) == 15 and args[14]:  # (its last argument: resting)
            rested.append(args[0])
        return ended

    monkeypatch.setattr(OrdinarySteps, "_end_ordinary", spy)
    lean, lean_alloc = _run(True, monkeypatch, every_s, told=True)
    assert [s["step"] for s in lean] == [s["step"] for s in full] == list(range(len(full)))
    for a, b in zip(lean, full, strict=True):
        if a["step"] == CLOSURE_STEP[0] and every_s:
            # A resting step sees its closure only at its end (the allocator then not as the last step
            # left it): the full way's reading at the closure's forward is not there, and what that
            # reading would have told, how the step's bytes split between temporaries and what was held
            # before it, may differ; its peak, phase and totals do not.
            a, b = ({k: v for k, v in s.items() if k not in ("memory", "at_peak")} for s in (a, b))
        assert a == b, a["step"]
    if every_s:
        assert len(rested) >= 5, rested  # usual steps between the special ones rest
        assert len(set(BLOCK_STEPS) & set(rested)) >= 3, (BLOCK_STEPS, rested)  # (resting between blocks)
    else:
        assert rested == []  # every step timed on the device: every one watched
    assert lean_alloc.reads < 0.6 * full_alloc.reads


def test_resting_cuda_steps_read_the_allocator_and_a_step_the_device_times_is_watched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alloc = _stand_ins(monkeypatch, every_s=3600.0)
    model, opt = _small()
    tracker = _tracker(model, opt)
    x = torch.randn(8, 16)
    watched: list[bool] = []

    def steps(n: int) -> None:
        for _ in range(n):
            alloc.new_step()
            with alloc, tracker.step(samples=8):
                watched.append(bool(model._forward_pre_hooks))
                _usual(model, opt, x)

    steps(6)
    reads, events = alloc.reads, CompletedEvent.recorded
    steps(20)
    rested = tracker.latest
    tracker._device_due = 0.0  # as if the time had passed: the next step is timed, watched
    steps(5)
    snap = tracker.latest
    tracker.close()
    assert not any(watched[6:26]) and watched[26] and not any(watched[27:]), watched
    assert alloc.reads - reads == 25  # one read at every step's end, resting or not
    assert CompletedEvent.recorded - events == 6  # the one timed step's marks
    assert rested is not None and snap is not None and snap.step == 30
    assert tracker.throughput.timing_step == 26 and snap.timing != rested.timing
    assert snap.timing.forward_s and snap.timing.backward_s and snap.timing.optimizer_s
    assert snap.peak_bytes == alloc.peak
