"""Ordinary steps with the model's forward hooks off (anatomy.hook.ordinary: "resting"): where a step is
given what its batch would tell (its samples; its tokens, if the batch has any), its forward runs
unwatched between the steps that look — and the history comes out as it does with the forward watched on
every step."""

from __future__ import annotations

import collections
import dataclasses
import sys
import time
from typing import Any

import pytest
import torch

import anatomy
from anatomy.hook import ordinary
from anatomy.vocabulary import Component
from tests.hook.test_lean_steps import (
    _PER_RUN,
    _TENSOR_SUMS,
    _closure,
    _mlp,
    _no_grad_forward_first,
    _usual,
)


@pytest.fixture(autouse=True)
def _nothing_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that compiled nothing (earlier tests of this process may have compiled: Dynamo's counters
    say so process-wide, and then the forward never rests)."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        monkeypatch.setattr(dynamo.utils, "counters", collections.defaultdict(collections.Counter))


def _watched(model: torch.nn.Module) -> bool:
    """Are the tracker's forward hooks on the model now (the only forward hooks these tests put there)?"""
    return bool(model._forward_pre_hooks) and bool(model._forward_hooks)


def test_a_step_given_its_samples_runs_its_forward_unwatched_and_shows_the_last_split() -> None:
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    watched: list[bool] = []
    for _ in range(20):
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, opt, x)
    built = tracker.history[2]  # (the steps that end in full are watched: the first ones, the looks)
    snap = tracker.latest
    tracker.close()
    assert watched[:3] == [True] * 3 and not any(watched[4:]), watched
    assert not _watched(model)  # (closed: nothing of ours stays)
    assert snap is not None and snap.step == 19 and snap.timing.step_s is not None
    assert snap.timing.optimizer_s is not None and snap.timing.samples_per_s is not None
    assert snap.timing.samples_per_s == pytest.approx(8 / snap.timing.step_s)
    assert built.timing.forward_s is not None and built.timing.backward_s is not None
    t, b = snap.timing, built.timing
    assert t.forward_s is not None and t.backward_s is not None and t.optimizer_s is not None
    assert b.step_s is not None and b.optimizer_s is not None
    scale = (t.step_s - t.optimizer_s) / (b.step_s - b.optimizer_s)  # (the build's, scaled: test_step_feed)
    assert t.forward_s == pytest.approx(b.forward_s * scale) and t.backward_s == pytest.approx(
        b.backward_s * scale
    )
    assert t.forward_s + t.backward_s + t.optimizer_s <= t.step_s * (1 + 1e-9)


def test_where_the_batch_tells_the_tokens_the_forward_stays_watched_unless_the_step_is_given_them() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Flatten(), torch.nn.Linear(8 * 6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    ids = torch.randint(0, 32, (4, 6))
    watched: list[bool] = []
    for i in range(24):
        tokens = 24 if i >= 12 else None
        with tracker.step(samples=4, tokens=tokens):
            watched.append(_watched(model))
            _usual(model, opt, ids)
    snap = tracker.latest
    tracker.close()
    assert all(watched[:12]) and not any(watched[12:]), watched
    assert snap is not None and snap.timing.tokens_per_s == pytest.approx(24 / (snap.timing.step_s or 1.0))


def _special_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, tracker: Any) -> dict[str, Any]:
    """Every kind of step test_lean_steps.py runs but a second forward and a new batch shape (which a
    resting step does not see: the next look does), each given its samples."""
    x = torch.randn(8, 16)

    def with_closure() -> None:
        with tracker.step(samples=8):
            _closure(model, opt, x)

    def backward_end() -> None:
        with tracker.step(samples=8):
            model(x).sum().backward()
            tracker.backward_end()  # a framework's callback (the Trainer's on_substep_end)
            opt.step()
            opt.zero_grad()

    def no_update() -> None:
        with tracker.step(samples=8):  # a block without an update: the step goes on in the next one
            model(x).sum().backward()

    def raising() -> None:
        try:
            with tracker.step(samples=8):
                model(x).sum().backward()
                raise ValueError("the user's own")
        except ValueError:
            opt.zero_grad()

    def by_hand() -> None:
        tracker.begin_step(samples=8)  # begin/end by hand, as a framework does
        _usual(model, opt, x)
        tracker.end_step()

    def trainer() -> None:
        tracker.begin_step(samples=8)  # the Hugging Face Trainer's calls around the optimizer's own hooks
        model(x).sum().backward()
        tracker.optimizer_begin()
        opt.step(closure=None)
        tracker.optimizer_end()
        opt.zero_grad()
        tracker.end_step()

    def no_grad_first() -> None:
        with tracker.step(samples=8):
            _no_grad_forward_first(model, opt, x)

    def unsized() -> None:
        with tracker.step():  # not told its samples: this one watches its forward
            _usual(model, opt, x)

    return {
        "unsized": unsized,
        "closure": with_closure,
        "backward_end": backward_end,
        "no_update": no_update,
        "raising": raising,
        "by_hand": by_hand,
        "trainer": trainer,
        "no_grad_first": no_grad_first,
    }


def _run(
    rest: bool, special: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[dict[str, Any]], float, list[bool]]:
    """Usual steps (resting from the fourth on), the special one, usual steps."""
    monkeypatch.setattr(ordinary, "REST_ON", rest)
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    watched: list[bool] = []
    body = _special_steps(model, opt, tracker)[special]
    for i in range(10):
        if i == 6:
            watched.append(_watched(model))
            body()
            continue
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, opt, x)
    loss = float(model(x).sum().detach())
    history = []
    for snap in tracker.history:
        fields = {k: v for k, v in dataclasses.asdict(snap).items() if k not in _PER_RUN}
        fields["memory"] = {c: v if c in _TENSOR_SUMS else v is not None for c, v in snap.memory.items()}
        history.append(fields)
    tracker.close()
    return history, loss, watched


@pytest.mark.parametrize(
    "special",
    ["unsized", "closure", "backward_end", "no_update", "raising", "by_hand", "trainer", "no_grad_first"],
)
def test_a_resting_step_of_any_kind_comes_out_as_a_watched_one(
    special: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    watched, watched_loss, always = _run(False, special, monkeypatch)
    resting, resting_loss, rested = _run(True, special, monkeypatch)
    assert all(always) and not any(rested[3:7]), rested  # (the special step began unwatched)
    assert resting_loss == watched_loss
    assert [s["step"] for s in resting] == [s["step"] for s in watched]
    for a, b in zip(resting, watched, strict=True):
        assert a == b, a["step"]


def test_a_step_of_other_samples_is_followed_by_a_watched_one_that_counts_its_batch() -> None:
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x, wide = torch.randn(8, 16), torch.randn(12, 16)
    watched: list[bool] = []
    for batch in [x] * 8 + [wide] * 4:
        with tracker.step(samples=len(batch)):
            watched.append(_watched(model))
            _usual(model, opt, batch)
    history = list(tracker.history)
    tracker.close()
    assert not watched[7] and not watched[8] and watched[9], watched  # the wide batch's first step: unseen
    acts = [s.memory[Component.ACTIVATIONS] for s in history]
    assert acts[9] is not None and acts[7] is not None and acts[9] == acts[7] * 12 // 8  # counted anew
    assert [s.batch_size for s in history][9:] == [12] * 3


class _Sliced(torch.nn.Module):
    """Runs its layers through a new ModuleList every forward, as Hugging Face models slice theirs."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:3]:
            x = torch.relu(layer(x))
        return x


def test_the_registration_watch_rests_with_the_forward_and_sees_a_module_assigned_between_steps() -> None:
    torch.manual_seed(0)
    model = _Sliced()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    for _ in range(6):
        with tracker.step(samples=8):
            _usual(model, opt, x)
    assert tracker._model_watch.suspect is False and not _watched(model)
    weights = tracker.latest.memory[Component.WEIGHTS] if tracker.latest else None
    model.head = torch.nn.Linear(16, 16)  # assigned between steps: seen
    opt.add_param_group({"params": model.head.parameters()})
    with tracker.step(samples=8):
        watched = _watched(model)
        (model.head(model(x))).sum().backward()
        opt.step()
        opt.zero_grad()
    snap = tracker.latest
    tracker.close()
    head = sum(p.numel() * p.element_size() for p in model.head.parameters())
    assert watched and snap is not None and weights is not None
    assert snap.memory[Component.WEIGHTS] == weights + head


def test_once_anything_is_compiled_the_forward_stays_watched() -> None:
    """Dynamo guards on a traced module's hooks: taking ours off and putting them back would recompile."""
    import torch._dynamo

    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    watched: list[bool] = []
    for i in range(12):
        if i == 6:
            torch._dynamo.utils.counters["frames"]["ok"] += 1  # (a frame compiled somewhere in the process)
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, opt, x)
    tracker.close()
    assert not any(watched[3:6]) and all(watched[6:]), watched


def test_a_rebuild_due_while_resting_waits_for_a_look_and_every_snapshot_has_the_split() -> None:
    """A snapshot is built anew at least every few publish intervals; a resting step has no forward times
    to build with, so the rebuild waits for the next step that looks."""
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=0.01)
    x = torch.randn(8, 16)
    watched: list[bool] = []
    deadline = time.perf_counter() + 0.5  # (50 publish intervals: several rebuilds due)
    while time.perf_counter() < deadline:
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, opt, x)
            time.sleep(0.0005)
    history = list(tracker.history)
    tracker.close()
    assert len(history) >= 40 and sum(not w for w in watched) >= 10, watched
    assert all(s.timing.forward_s is not None and s.timing.backward_s is not None for s in history[1:])
