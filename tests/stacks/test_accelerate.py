"""accelerate with gradient accumulation, in both loop shapes the README shows: ``tracker.step()``
around each micro-batch (accelerate skips the optimizer step on non-sync micro-batches) and around
each optimizer step. Published steps, micro-batches, gradients and optimizer states are compared with
the training process's own count; losses with the same loop without the hook."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import accelerate
import pytest
import torch

import anatomy
from anatomy.hook.guard import Feature
from anatomy.hook.schedule import WARMUP_REFRESH_STEPS
from anatomy.vocabulary import Component

ACCUM = 4
MICRO = 24  # micro-batches: ACCUM per optimizer update


def _fresh_accelerator() -> Any:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return accelerate.Accelerator(gradient_accumulation_steps=ACCUM, cpu=True)


def _train(st: SimpleNamespace, shape: str, hook: bool) -> tuple[list[float], Any, Any]:
    """(losses, truth, tracker) of MICRO micro-batches; ``shape``: where ``tracker.step()`` goes."""
    accelerator = _fresh_accelerator()
    model = st.mlp(seed=0, width=32, depth=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    truth = st.Truth(model, [optimizer.optimizer])
    tracker = anatomy.track(model, optimizer) if hook else None
    data = st.batches(MICRO)
    losses: list[float] = []

    def micro_batch(x: torch.Tensor, y: torch.Tensor) -> None:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()  # a no-op on non-sync micro-batches (accelerate's wrapper)
            optimizer.zero_grad()
            losses.append(loss.item())

    if shape == "micro":
        for x, y in data:
            with tracker.step(samples=len(x)) if tracker is not None else _nothing():
                micro_batch(x, y)
    else:
        for i in range(0, MICRO, ACCUM):
            with tracker.step(samples=ACCUM * 8) if tracker is not None else _nothing():
                for x, y in data[i : i + ACCUM]:
                    micro_batch(x, y)
    if tracker is not None:
        tracker.close()
    truth.close()
    return losses, truth, tracker


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.mark.parametrize("shape", ["micro", "update"])
def test_accumulation_steps_are_updates(st: SimpleNamespace, published: list[Any], shape: str) -> None:
    plain_losses, _, _ = _train(st, shape, hook=False)
    del published[:]
    losses, truth, tracker = _train(st, shape, hook=True)
    assert losses == plain_losses  # bit-identical
    assert truth.updates == MICRO // ACCUM
    assert [s.step for s in published] == list(range(truth.updates))  # one step per update
    for snap in published:
        assert snap.grad_accum_steps == ACCUM
        assert snap.batch_size == 8
    for step in range(3):  # the first updates re-sum gradients and optimizer states
        mem = published[step].memory
        assert mem[Component.GRADIENTS.value] == truth.grads[step] > 0
        assert mem[Component.OPTIMIZER_STATES.value] == truth.states[step] > 0
    # and the figures stand on the later steps (nothing changed)
    assert published[-1].memory[Component.OPTIMIZER_STATES.value] == truth.states[-1]
    timing = published[-1].timing
    assert timing.step_s and timing.forward_s and timing.backward_s and timing.optimizer_s
    assert st.phases_sum(published[-1]) <= timing.step_s * 1.05
    assert timing.samples_per_s == pytest.approx(ACCUM * 8 / timing.step_s)
    assert tracker.latest is published[-1]


LONG_MICRO = 128  # micro-batches of the long run: 32 updates
SAMPLE_EVERY = 8  # the long run's re-sum cadence (sample_every): steps 0-2, then 8, 16, 24
LATE_MICRO = 50  # the micro-batch from which the late head is in the loss: update 12 first steps it


class _LateHead(torch.nn.Module):
    """A body and a head, and a second head the loss uses only from LATE_MICRO on (a task added to the
    curriculum): AdamW creates its moments for the late head's parameters at the first update that has
    their gradients, so the optimizer's state grows mid-run without anything the tracker watches
    changing (no parameter assigned, no requires_grad flipped, the same optimizer)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU())
        self.head = torch.nn.Linear(64, 1)
        self.late = torch.nn.Linear(64, 1)
        self.use_late = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        return self.head(h) + self.late(h) if self.use_late else self.head(h)


def _long_run(st: SimpleNamespace, hook: bool) -> tuple[list[float], Any, list[tuple[int, int, int, Any]]]:
    """LONG_MICRO micro-batches, ``tracker.step()`` around each: (losses, truth, and after every block
    that published a step, (step, published optimizer states, published gradients, the step they were
    re-summed on)))."""
    accelerator = _fresh_accelerator()
    model = _LateHead()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    truth = st.Truth(model, [optimizer.optimizer])
    tracker = anatomy.track(model, optimizer, sample_every=SAMPLE_EVERY) if hook else None
    if tracker is not None:
        # The sampled step's profiler and per-op trace cost what the process makes them (a first profile
        # after the suite's other tests: tens of ms), and the shared budget they spend then holds the
        # re-sums back past this run's end; what this test asks is where the re-sums fall.
        tracker._guard.turn_off(Feature.OP_GROUPS)
        tracker._guard.turn_off(Feature.HEAP_TRACE)
    losses: list[float] = []
    seen: list[tuple[int, int, int, Any]] = []
    for i, (x, y) in enumerate(st.batches(LONG_MICRO)):
        model.use_late = i >= LATE_MICRO
        updates = truth.updates
        block = tracker.step(samples=len(x)) if tracker is not None else _nothing()
        with block, accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            # Steps of a few milliseconds: re-sums answer to the hook's time budget (1% of the training
            # time), and a tiny model's sub-millisecond steps would leave it no room within this run.
            time.sleep(0.01)
        losses.append(loss.item())
        if tracker is not None and truth.updates > updates:  # this block's update published a step
            snap = tracker.latest
            assert snap is not None
            mem = snap.memory
            states, grads = mem[Component.OPTIMIZER_STATES.value], mem[Component.GRADIENTS.value]
            seen.append((snap.step, states, grads, snap.sums_step))
        else:
            assert tracker is None or tracker.latest is None or tracker.latest.step == truth.updates - 1
    if tracker is not None:
        tracker.close()
    truth.close()
    return losses, truth, seen


def test_micro_batch_steps_re_sum_on_update_steps_for_a_long_run(
    st: SimpleNamespace, published: list[Any]
) -> None:
    """The issue's defect: with ``tracker.step()`` around each micro-batch the re-sums fell on micro-batches
    where the optimizer never updates (0 B of optimizer states after 128 micro-batches). Now every step is
    an update: the first ones re-sum, and so do the schedule's later samples (one in SAMPLE_EVERY where the
    time budget has room, else the first later step that has) — the late head's moments, created at update
    12, appear at the first re-sum after it, an update step like every other; each snapshot names the step
    its sums are from (``sums_step``), and they are that step's exact figures."""
    plain, _, _ = _long_run(st, hook=False)
    del published[:]
    losses, truth, seen = _long_run(st, hook=True)
    assert losses == plain  # bit-identical
    updates = LONG_MICRO // ACCUM
    assert truth.updates == updates
    assert [s.step for s in published] == list(range(updates))
    assert all(s.grad_accum_steps == ACCUM for s in published)
    assert [step for step, _, _, _ in seen] == list(range(updates))  # each published as its update ran

    first_late = LATE_MICRO // ACCUM
    assert truth.states[first_late] > truth.states[first_late - 1] > 0  # the state really grew there
    assert truth.grads[first_late] > truth.grads[first_late - 1] > 0
    resums = sorted({resummed for _, _, _, resummed in seen})
    assert resums[:WARMUP_REFRESH_STEPS] == list(range(WARMUP_REFRESH_STEPS))
    # later ones on a multiple of SAMPLE_EVERY, or on the first step after one that the budget had room
    for before, k in zip(resums[WARMUP_REFRESH_STEPS - 1 :], resums[WARMUP_REFRESH_STEPS:], strict=False):
        assert any(m % SAMPLE_EVERY == 0 for m in range(before + 1, k + 1)), (before, k)
    after = next(k for k in resums if k > first_late)  # (the run is long enough for one)
    for step, states, grads, resummed in seen:
        assert resummed <= step and resummed == max(k for k in resums if k <= step)
        assert (states, grads) == (truth.states[resummed], truth.grads[resummed]), step
        if not first_late <= step < after:  # nothing changed since that re-sum: today's count
            assert (states, grads) == (truth.states[step], truth.grads[step]), step
    assert seen[after][1] > seen[after - 1][1]  # the sampled re-sum found the grown state


def _resting_run(
    st: SimpleNamespace, shape: str, hook: bool, steps: int
) -> tuple[list[Any], list[float], list[bool]]:
    """``steps`` updates of the loop in ``shape``, told each block's samples (``hook``: tracked, nothing
    sampled, no rebuild by the clock): its comparable history, its losses, whether our hooks were on the
    model at each micro-batch."""
    from tests.stacks.stack_helpers import comparable

    accelerator = _fresh_accelerator()
    model = st.mlp(seed=0, width=32, depth=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    tracker = (
        anatomy.track(model, optimizer, publish=False, sample_every=0, interval_s=3600.0) if hook else None
    )
    data = st.batches(steps * ACCUM)
    losses: list[float] = []
    watched: list[bool] = []

    def micro_batch(x: torch.Tensor, y: torch.Tensor) -> None:
        watched.append(bool(model._forward_pre_hooks))
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())

    for i in range(0, steps * ACCUM, ACCUM):
        window = data[i : i + ACCUM]
        if shape == "micro":
            for x, y in window:
                with tracker.step(samples=len(x)) if tracker is not None else _nothing():
                    micro_batch(x, y)
        else:
            with tracker.step(samples=ACCUM * 8) if tracker is not None else _nothing():
                for x, y in window:
                    micro_batch(x, y)
    if tracker is None:
        return [], losses, watched
    history = comparable(tracker.history)
    tracker.close()
    return history, losses, watched


@pytest.mark.parametrize("shape", ["micro", "update"])
def test_accumulating_steps_rest_and_publish_what_watched_steps_do(
    st: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, shape: str, nothing_compiled: None
) -> None:
    """accelerate's accumulation, told each block's samples: from the 5th step on a step's micro-batches run
    with no hook of ours on the model (in blocks of their own, the step rests between them; in one block, it
    takes the look's count of forwards), and every snapshot but its times is the same loop's with every step
    watched; the losses are the loop's without the hook."""
    from anatomy.hook import resting

    steps = 16
    monkeypatch.setattr(resting, "REST_ON", False)
    full, full_losses, always = _resting_run(st, shape, True, steps)
    monkeypatch.setattr(resting, "REST_ON", True)
    rested, rest_losses, flags = _resting_run(st, shape, True, steps)
    _, plain_losses, _ = _resting_run(st, shape, False, steps)
    assert all(always) and not any(flags[4 * ACCUM :]), flags
    assert rest_losses == full_losses == plain_losses
    assert [s["step"] for s in rested] == [s["step"] for s in full] == list(range(steps))
    for a, b in zip(rested, full, strict=True):
        assert a == b, a["step"]
    assert rested[-1]["grad_accum_steps"] == ACCUM
