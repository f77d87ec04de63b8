"""The hook's own cost: an ordinary step's snapshot is the last one repeated (equal to a full build),
the optional work answers to the budget, and the hot path makes no garbage that costs collections."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path
from typing import Any

import torch

import anatomy
from anatomy.hook.schedule import COUNT, HEAP, Budget, Schedule

_PER_STEP = ("seq", "time", "timing", "suggestions")  # what differs between two builds of one step anyway


def _mlp(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, n: int, tracker: Any = None) -> None:
    x = torch.randn(8, 32)
    for _ in range(n):
        if tracker is not None:
            with tracker.step():
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
        else:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()


def _fields(snap: Any) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(snap).items() if k not in _PER_STEP}


def test_an_ordinary_steps_snapshot_equals_a_full_build(tmp_path: Path) -> None:
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    _steps(model, opt, 8, tracker)
    repeated = tracker.latest
    assert repeated is not None and repeated.step == 7
    assert tracker.history[7].memory is tracker.history[4].memory  # repeated, not built
    full = tracker.rebuild()  # the same finished step, built in full
    tracker.close()
    assert full is not None and full is not repeated and full.step == 7
    assert _fields(full) == _fields(repeated)
    assert [s.step for s in tracker.history][:8] == list(range(8))


def test_a_new_batch_size_is_built_in_full() -> None:
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    _steps(model, opt, 5, tracker)
    with tracker.step():
        model(torch.randn(3, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
    snap = tracker.latest
    tracker.close()
    assert snap is not None and snap.step == 5 and snap.batch_size == 3


def test_the_budget_holds_back_what_does_not_fit() -> None:
    now = [0.0]
    budget = Budget(0.01, clock=lambda: now[0])
    assert budget.allows(COUNT)  # nothing measured yet
    budget.charge(COUNT, 0.05)
    now[0] = 4.0  # 40 ms of budget so far, 50 ms spent
    assert not budget.allows(COUNT) and not budget.allows(HEAP)
    now[0] = 10.0  # 100 ms: room for another 50 ms count
    assert budget.allows(COUNT)
    s = Schedule(sample_every=10, interval_s=1.0, budget=budget)
    for _ in range(3):
        s.note_step_s(0.25)
    budget.charge("sampled", 1.0)  # a costly sampled step: later ones wait until it is paid for
    assert not s.sample_due(10) and not s.sample_due(11)
    now[0] = 300.0
    assert s.sample_due(12) and not s.sample_due(13)  # the owed one, then back to one in ten
    s.input_shape, s.counted_step = (4, 8), 12
    budget.charge(COUNT, 10.0)  # a count far over budget
    assert not s.count_due(20, (4, 8), already=False)  # an interval later, but no room
    assert s.count_due(21, (8, 8), already=False)  # a new shape is counted whatever the budget


def test_the_hook_causes_no_older_collections_than_the_plain_loop(tmp_path: Path) -> None:
    """2,000 steps of a tiny MLP (10,000 would take a minute): the hook's per-step objects are few and
    freed at once, so it adds no gen-1/gen-2 collection and at most a few young ones."""
    steps = 2000

    def run(hooked: bool) -> list[int]:
        model, opt = _mlp()
        tracker = anatomy.track(model, opt, directory=tmp_path, record=False) if hooked else None
        _steps(model, opt, 10, tracker)  # set-up, the warm-up and sampled steps: not the steady state
        gc.collect()  # every arm from empty generations (what earlier tests left would decide which is older)
        counts = [0, 0, 0]

        def count(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                counts[info["generation"]] += 1

        gc.callbacks.append(count)
        try:
            _steps(model, opt, steps, tracker)
        finally:
            gc.callbacks.remove(count)
        if tracker is not None:
            tracker.close()
        return counts

    plain = [run(False) for _ in range(2)]
    hooked = run(True)
    most = [max(p[g] for p in plain) for g in range(3)]
    assert hooked[2] <= most[2] and hooked[1] <= most[1], (hooked, plain)
    assert hooked[0] <= most[0] + steps // 500, (hooked, plain)


def test_the_saved_tensor_count_says_which_step_it_is_from() -> None:
    """Counted on the first steps, then not (a publish interval of an hour): every later snapshot's
    activations are the last count's, and ``activations_step`` names that step."""
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    _steps(model, opt, 8, tracker)
    x = torch.randn(16, 32)  # a new shape: counted again, on this step
    with tracker.step():
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
    history = list(tracker.history)
    tracker.close()
    counted = {s.step for s in history if s.activations_step == s.step}
    assert {0, 1, 2, 8} <= counted and not counted & {3, 4, 5, 6, 7}
    for snap in history[3:8]:
        assert snap.activations_step == 2
        assert snap.memory["activations"] == history[2].memory["activations"]
    assert history[8].memory["activations"] != history[7].memory["activations"]  # twice the batch


def test_an_ordinary_step_runs_few_of_the_hooks_python_calls(tmp_path: Path) -> None:
    """After a big step the hook's code is cold in the CPU caches and every Python call of it costs
    microseconds: an ordinary step stays within a fixed number of them (12 when this was written: the
    step context's three, begin, the two forward and two optimizer hooks, the optimizer watch, end and its
    O(1) row; 43 before the step feed, ~140 before the lean per-step path), whatever the model."""
    import sys

    model, opt = _mlp()
    tracker = anatomy.track(model, opt, directory=tmp_path, record=False, interval_s=3600.0)
    _steps(model, opt, 20, tracker)  # warm-up, the sampled step 1, the first counts and heap reads
    calls = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event == "call" and "anatomy" in frame.f_code.co_filename:
            calls += 1

    sys.setprofile(profile)
    try:
        _steps(model, opt, 10, tracker)
    finally:
        sys.setprofile(None)
    tracker.close()
    assert calls / 10 <= 14, calls / 10
