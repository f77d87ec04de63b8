"""Resting steps under gradient accumulation (anatomy.hook.resting): a step of several micro-batches — a block
each (accelerate's ``accumulate``, the Trainer's and Lightning's accumulation), or all in one block — rests as
a step of one does, its blocks told their samples; whatever else happens (a short window at an epoch's end,
an update skipped or made outside any block, an exception in a middle block, a block of other samples, the run
ending between blocks) comes out as it does with every step watched."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

import anatomy
from anatomy.hook import resting
from anatomy.hook.lean import BETWEEN
from tests.hook.test_lean_steps import _PER_RUN, _TENSOR_SUMS, _mlp

pytestmark = pytest.mark.usefixtures("nothing_compiled")  # (tests/conftest.py)

MICRO = 4  # micro-batches a step
BATCH = 8  # samples a micro-batch


def _watched(model: torch.nn.Module) -> bool:
    return bool(model._forward_pre_hooks) and bool(model._forward_hooks)


class _Loop:
    """A loop that accumulates ``MICRO`` micro-batches a step, in blocks of their own or in one block,
    noting at each block's start whether our hooks watch the model."""

    def __init__(self, tracker: Any, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        self.tracker, self.model, self.opt = tracker, model, opt
        self.x = torch.randn(BATCH, 16)
        self.watched: list[bool] = []

    def micro(self, x: torch.Tensor | None = None) -> None:
        self.model(self.x if x is None else x).sum().backward()

    def update(self) -> None:
        self.opt.step()
        self.opt.zero_grad()

    def block(self, body: Callable[[], None], samples: int | None = BATCH) -> None:
        with self.tracker.step(samples=samples):
            self.watched.append(_watched(self.model))
            body()

    def blocks(self, n: int = MICRO, update_at: int | None = None) -> None:
        """``n`` blocks of one micro-batch, the update in the last (or after block ``update_at``)."""
        last = n - 1 if update_at is None else update_at
        for i in range(n):
            self.block(lambda i=i: (self.micro(), self.update() if i == last else None))

    def one_block(self, n: int = MICRO) -> None:
        def body() -> None:
            for _ in range(n):
                self.micro()
            self.update()

        self.block(body, samples=n * BATCH)


def _special(loop: _Loop) -> dict[str, Callable[[], None]]:
    def outside_early() -> None:  # the update after the second block, outside any: two steps of two
        loop.blocks(2, update_at=-1)
        loop.update()
        loop.blocks(2)

    def raising() -> None:
        loop.block(loop.micro)
        try:
            with loop.tracker.step(samples=BATCH):
                loop.micro()
                raise ValueError("the user's own")
        except ValueError:
            loop.opt.zero_grad()

    def other_samples() -> None:
        loop.block(loop.micro)
        loop.block(lambda: loop.micro(torch.randn(BATCH - 2, 16)), samples=BATCH - 2)
        loop.blocks(2)

    def untold() -> None:
        loop.block(loop.micro)
        loop.block(loop.micro, samples=None)
        loop.blocks(2)

    def by_hand_end() -> None:  # an end without a begin between two blocks (a framework's stray call)
        loop.block(loop.micro)
        loop.tracker.end_step()
        loop.blocks(3)

    return {
        "short": lambda: loop.blocks(2),  # an epoch's last window
        "long": lambda: loop.blocks(MICRO + 1),  # an update skipped (fp16's scaler): the next block's
        "outside_last": lambda: (loop.blocks(MICRO, update_at=-1), loop.update()),
        "outside_early": outside_early,
        "raising": raising,
        "other_samples": other_samples,
        "untold": untold,
        "by_hand_end": by_hand_end,
        "one_block_short": lambda: loop.one_block(MICRO - 1),
    }


def _history(tracker: Any) -> list[dict[str, Any]]:
    history = []
    for snap in tracker.history:
        fields = {k: v for k, v in dataclasses.asdict(snap).items() if k not in _PER_RUN}
        fields["memory"] = {c: v if c in _TENSOR_SUMS else v is not None for c, v in snap.memory.items()}
        history.append(fields)
    return history


def _run(
    rest: bool, form: str, special: str | None, monkeypatch: pytest.MonkeyPatch, trailing: int = 0
) -> tuple[list[dict[str, Any]], float, list[bool]]:
    """Ten steps of ``form`` (resting from the fourth on), the special one as the seventh; ``trailing``
    blocks without an update before the tracker closes."""
    monkeypatch.setattr(resting, "REST_ON", rest)
    model, opt = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    loop = _Loop(tracker, model, opt)
    for i in range(10):
        if i == 6 and special is not None:
            _special(loop)[special]()
        elif form == "blocks":
            loop.blocks()
        else:
            loop.one_block()
    for _ in range(trailing):
        loop.block(loop.micro)
    tracker.close()
    loss = float(model(loop.x).sum().detach())
    return _history(tracker), loss, loop.watched


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert [s["step"] for s in a] == [s["step"] for s in b]
    for x, y in zip(a, b, strict=True):
        assert x == y, x["step"]


@pytest.mark.parametrize("form", ["blocks", "one_block"])
def test_an_accumulating_step_rests_and_shows_its_micro_batches_and_samples(
    form: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    watched, watched_loss, always = _run(False, form, None, monkeypatch)
    rested, rested_loss, flags = _run(True, form, None, monkeypatch)
    per_step = MICRO if form == "blocks" else 1
    assert all(always)
    assert all(flags[: 3 * per_step]) and not any(flags[4 * per_step :]), flags  # (rests from the 5th)
    assert rested_loss == watched_loss
    _same(rested, watched)
    assert rested[-1]["grad_accum_steps"] == MICRO


def test_a_resting_step_between_blocks_holds_no_hook_of_ours_and_reports_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, _ = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    loop = _Loop(tracker, model, opt)
    for _ in range(6):
        loop.blocks()
    loop.block(loop.micro)  # the first block of the seventh step: no update
    lean = tracker._lean
    between = lean.active and lean.stage == BETWEEN
    hooks_between = _watched(model) or bool(opt._optimizer_step_post_hooks)
    loop.blocks(MICRO - 1)
    snap = tracker.latest
    tracker.close()
    assert between and not hooks_between
    assert snap is not None and snap.step == 6 and snap.grad_accum_steps == MICRO
    t = snap.timing
    assert t.step_s is not None and t.samples_per_s == pytest.approx(MICRO * BATCH / t.step_s)


@pytest.mark.parametrize(
    ("form", "special"),
    [
        ("blocks", "short"),
        ("blocks", "long"),
        ("blocks", "outside_last"),
        ("blocks", "outside_early"),
        ("blocks", "raising"),
        ("blocks", "other_samples"),
        ("blocks", "untold"),
        ("blocks", "by_hand_end"),
        ("one_block", "short"),
        ("one_block", "one_block_short"),
        ("one_block", "raising"),
    ],
)
def test_whatever_happens_in_an_accumulating_resting_step_comes_out_as_watched(
    form: str, special: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    watched, watched_loss, always = _run(False, form, special, monkeypatch)
    rested, rested_loss, flags = _run(True, form, special, monkeypatch)
    per_step = MICRO if form == "blocks" else 1
    assert all(always) and not any(flags[4 * per_step : 6 * per_step]), flags
    assert rested_loss == watched_loss
    _same(rested, watched)


@pytest.mark.parametrize("trailing", [1, MICRO - 1])
def test_a_run_that_ends_between_blocks_keeps_no_step_of_them(
    trailing: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    watched, _, _ = _run(False, "blocks", None, monkeypatch, trailing=trailing)
    rested, _, _ = _run(True, "blocks", None, monkeypatch, trailing=trailing)
    assert [s["step"] for s in rested][-1] == 9
    _same(rested, watched)
