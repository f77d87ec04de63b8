"""The ordinary step's O(1) path (anatomy.hook.lean): whatever happens inside a step — a second forward, a
forward without gradients, a closure, a framework's callback, a block without an update, an exception,
a new batch shape — the history comes out as it does when every step goes the full way."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

import anatomy
from anatomy.hook import ordinary
from anatomy.hook.lean import BEGUN, FORWARD_DONE, IN_FORWARD, IN_OPTIMIZER, UPDATED, LeanStep
from anatomy.hook.ordinary import OrdinarySteps
from anatomy.hook.record import StepRecord
from anatomy.hook.timing import (
    BACKWARD_END,
    BEGIN,
    END,
    FORWARD_POST,
    FORWARD_PRE,
    OPTIMIZER_POST,
    OPTIMIZER_PRE,
)
from anatomy.vocabulary import Component

# What differs between two runs of the same steps anyway: when, how long, what the advisor made of it, and
# what comes from the process's heap (the second run's starts where the first one's left it).
_PER_RUN = (
    "seq",
    "time",
    "timing",
    "suggestions",
    "achieved_tflops",
    "mfu",
    "peak_bytes",
    "peak_phase",
    "at_peak",
)
_TENSOR_SUMS = (Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES, Component.ACTIVATIONS)


TRAINER_STEPS = 3


def _mlp() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def _usual(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


def _two_forwards(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).sum().backward()
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


def _no_grad_forward_first(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    with torch.no_grad():
        model(x)  # a look at the model (a teacher's, an evaluation): not the step's forward
    _usual(model, opt, x)


def _closure(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    opt.step(closure)
    opt.zero_grad()


def _step_on(name: str) -> Callable[[Any, torch.nn.Module, torch.optim.Optimizer, torch.Tensor], None]:
    def run(tracker: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
        model(x).sum().backward()
        if name == "backward_end":
            tracker.backward_end()  # a framework's callback (the Trainer's on_substep_end)
        opt.step()
        if name == "optimizer_end":
            tracker.optimizer_end()
        opt.zero_grad()

    return run


def _run(lean: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], list[float]]:
    monkeypatch.setattr(ordinary, "ORDINARY_IN_O1", lean)
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x, wide = torch.randn(8, 16), torch.randn(12, 16)
    losses: list[float] = []

    def step(body: Callable[[], None]) -> None:
        with tracker.step():
            body()

    for _ in range(8):
        step(lambda: _usual(model, opt, x))
    step(lambda: _two_forwards(model, opt, x))
    step(lambda: _usual(model, opt, x))
    step(lambda: _no_grad_forward_first(model, opt, x))
    step(lambda: _closure(model, opt, x))
    step(lambda: _step_on("backward_end")(tracker, model, opt, x))
    step(lambda: _step_on("optimizer_end")(tracker, model, opt, x))
    with tracker.step():  # a block without an update: the step goes on in the next one
        model(x).sum().backward()
    step(lambda: _usual(model, opt, x))
    try:
        with tracker.step():
            model(x).sum().backward()
            raise ValueError("the user's own")
    except ValueError:
        opt.zero_grad()

    def refuse(*args: Any) -> None:
        raise RuntimeError("the user's optimizer hook")

    handle = opt.register_step_pre_hook(refuse)  # raises inside the optimizer's step, after ours
    try:
        step(lambda: _usual(model, opt, x))
    except RuntimeError:
        opt.zero_grad()
    handle.remove()
    step(lambda: _usual(model, opt, wide))  # a new batch shape
    for _ in range(4):
        step(lambda: _usual(model, opt, wide))
    tracker.begin_step()  # begin/end by hand, as a framework does
    _usual(model, opt, x)
    tracker.end_step()
    for _ in range(3):
        step(lambda: _usual(model, opt, x))
    for i in range(TRAINER_STEPS):  # the Hugging Face Trainer's calls around the optimizer's own hooks
        tracker.begin_step()
        model(x).sum().backward()
        tracker.optimizer_begin()
        if i % 2:
            opt.step(None)  # accelerate's optimizer passes its ``closure=None`` on
        else:
            opt.step(closure=None)
        tracker.optimizer_end()
        opt.zero_grad()
        tracker.end_step()
    losses.append(float(model(x).sum().detach()))
    history = []
    for snap in tracker.history:
        fields = {k: v for k, v in dataclasses.asdict(snap).items() if k not in _PER_RUN}
        # the tensor sums exactly; of the heap's figures, which are measured
        fields["memory"] = {c: v if c in _TENSOR_SUMS else v is not None for c, v in snap.memory.items()}
        fields["at_peak"] = None if snap.at_peak is None else sorted(snap.at_peak)
        history.append(fields)
    tracker.close()
    return history, losses


def test_every_step_comes_out_as_the_full_way_makes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    full, full_losses = _run(False, monkeypatch)
    promoted: dict[int, int] = {}  # the stage each lean step became a record at
    real = OrdinarySteps._promote

    def spy(self: Any) -> StepRecord:
        promoted[self._lean.index] = self._lean.stage
        return real(self)

    monkeypatch.setattr(OrdinarySteps, "_promote", spy)
    lean, lean_losses = _run(True, monkeypatch)
    stages = set(promoted.values())
    assert {BEGUN, FORWARD_DONE, IN_OPTIMIZER, UPDATED} <= stages  # (IN_FORWARD: the unit test below)
    assert not set(promoted) & set(range(len(lean) - TRAINER_STEPS, len(lean)))  # the Trainer's: lean
    assert lean_losses == full_losses
    assert [s["step"] for s in lean] == [s["step"] for s in full] == list(range(len(full)))
    for a, b in zip(lean, full, strict=True):
        assert a == b, a["step"]
    micro = {s["step"]: s["grad_accum_steps"] for s in lean}
    assert micro[8] == 2 and micro[9] == 1  # the second forward counted, then one again
    assert {s["batch_size"] for s in lean} == {8, 12}


def _run_auto(lean: bool, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """A loop without step boundaries: a training-mode forward begins each step, the update ends it."""
    monkeypatch.setattr(ordinary, "ORDINARY_IN_O1", lean)
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x, wide = torch.randn(8, 16), torch.randn(12, 16)
    for batch in [x] * 10 + [wide] * 4 + [x] * 4:
        _usual(model, opt, batch)
    model.eval()
    with torch.no_grad():
        model(x)  # an evaluation between steps: no step
    model.train()
    for _ in range(3):
        _usual(model, opt, x)
    history = [
        {k: v for k, v in dataclasses.asdict(snap).items() if k not in (*_PER_RUN, "memory")}
        | {"sums": {c: snap.memory[c] for c in _TENSOR_SUMS}}
        for snap in tracker.history
    ]
    tracker.close()
    return history


def test_a_loop_without_step_boundaries_comes_out_as_the_full_way_makes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    full = _run_auto(False, monkeypatch)
    ended: list[int] = []
    real = OrdinarySteps._end_ordinary

    def spy(self: Any, index: int, *args: Any) -> bool:
        done = real(self, index, *args)
        if done and self._lean.active:  # (the lean end; a record that ended plain has none active)
            ended.append(index)
        return done

    monkeypatch.setattr(OrdinarySteps, "_end_ordinary", spy)
    lean = _run_auto(True, monkeypatch)
    assert [s["step"] for s in lean] == [s["step"] for s in full] == list(range(21))
    for a, b in zip(lean, full, strict=True):
        assert a == b, a["step"]
    assert len(ended) >= 10, ended  # most steps began and ended lean


def test_ordinary_steps_take_the_lean_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A usual step after the first ones neither makes nor resets a record: the one of the step before
    the last ordinary step stays what it was."""
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    made: list[int] = []
    real_init = StepRecord.__init__

    def counting_init(self: StepRecord, *args: Any, **kwargs: Any) -> None:
        made.append(args[0] if args else kwargs["index"])
        real_init(self, *args, **kwargs)

    for _ in range(6):
        with tracker.step():
            _usual(model, opt, x)
    monkeypatch.setattr(StepRecord, "__init__", counting_init)
    for _ in range(20):
        with tracker.step():
            _usual(model, opt, x)
    snap = tracker.latest
    tracker.close()
    assert made == []
    assert snap is not None and snap.step == 25
    assert (
        snap.timing.step_s > 0 and snap.timing.forward_s is not None and snap.timing.optimizer_s is not None
    )


@pytest.mark.parametrize("stage", [BEGUN, IN_FORWARD, FORWARD_DONE, IN_OPTIMIZER, UPDATED])
def test_a_lean_step_as_a_record_is_the_general_paths_record(stage: int) -> None:
    lean = LeanStep()
    lean.learn_shape((8, 32))
    assert (lean.shape_samples, lean.shape_tokens) == (8, 256)
    lean.index, lean.auto, lean.samples, lean.tokens = 41, False, None, 5
    lean.started, lean.forward_pre, lean.forward_post = 1.0, 2.0, 3.0
    lean.optimizer_pre, lean.optimizer_post = 4.0, 5.0
    lean.grads_begin, lean.opt_begin = 7, 11
    lean.samples_seen, lean.tokens_seen = 8, 256
    lean.stage, lean.active = stage, True
    rec = lean.record(None, gradients=13, optimizer_states=17)
    kinds = [kind for kind, _ in rec.clock.marks]
    expected = [BEGIN, FORWARD_PRE, FORWARD_POST, OPTIMIZER_PRE, OPTIMIZER_POST][: stage + 1]
    assert kinds == expected
    assert [t for _, t in rec.clock.marks] == [1.0, 2.0, 3.0, 4.0, 5.0][: stage + 1]
    assert rec.index == 41 and rec.samples is None and rec.tokens == 5 and rec.plain and rec.quiet
    assert (rec.grads_begin, rec.opt_begin, rec.started) == (7, 11, 1.0)
    assert rec.micro == (1 if stage >= IN_FORWARD else 0)
    assert rec.samples_seen == (8 if stage >= IN_FORWARD else 0)
    assert rec.in_forward == (1 if stage == IN_FORWARD else 0)
    assert rec.optimizer_ran == (stage >= IN_OPTIMIZER) and rec.in_optimizer == (stage == IN_OPTIMIZER)
    assert rec.grads == (13 if stage >= IN_OPTIMIZER else None)
    assert rec.updated == (stage == UPDATED) and rec.opt_after == (17 if stage == UPDATED else None)
    # reused: the spare record comes out the same
    again = lean.record(rec, gradients=13, optimizer_states=17)
    assert again is rec and [kind for kind, _ in again.clock.marks] == expected
    assert END not in [kind for kind, _ in again.clock.marks]  # in progress: no end yet
    lean.active, lean.ended = False, 6.0
    if stage == UPDATED:  # a finished step ends with its end
        assert lean.record(None, 13, 17).clock.marks[-1] == (END, 6.0)


def test_a_framework_steps_lean_state_as_a_record() -> None:
    """Lightning's usual step on a LeanStep (anatomy.hook.framework): a forward the framework opened with
    the model's own forward nested in it, the closure wrapped, a backward's end — as the record the full
    way holds at that point."""
    lean = LeanStep()
    lean.index, lean.started, lean.forward_pre, lean.forward_post = 3, 1.0, 2.0, 3.0
    lean.stage, lean.active, lean.framework, lean.depth, lean.closure = IN_FORWARD, True, True, 1, True
    rec = lean.record(None, gradients=0, optimizer_states=0)
    assert rec.in_forward == 2 and rec.micro == 1  # the framework's forward and the model's
    lean.stage, lean.depth, lean.backward_ended = FORWARD_DONE, 0, 3.5
    rec = lean.record(None, gradients=0, optimizer_states=0)
    assert rec.in_forward == 0
    assert [kind for kind, _ in rec.clock.marks] == [BEGIN, FORWARD_PRE, FORWARD_POST, BACKWARD_END]
    assert rec.clock.marks[-1] == (BACKWARD_END, 3.5)
