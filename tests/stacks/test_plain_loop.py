"""A plain PyTorch loop, in the shapes people write it: ``tracker.step()`` around each micro-batch with
the optimizer stepped every few, and around forward and backward only with the optimizer stepped after
the block. Either way a published step is one optimizer update (the process's own post-hook count) and
the figures are the process's own sums; losses are those of the loop without the hook."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import anatomy
from anatomy.vocabulary import Component

MICRO = 12


def _train(st: SimpleNamespace, shape: str, hook: bool) -> tuple[list[float], Any]:
    model = st.mlp(seed=0, width=32, depth=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    truth = st.Truth(model, [optimizer])
    tracker = anatomy.track(model, optimizer) if hook else None
    losses: list[float] = []
    for i, (x, y) in enumerate(st.batches(MICRO)):
        if tracker is not None:
            tracker.begin_step(samples=len(x))
        loss = torch.nn.functional.mse_loss(model(x), y)
        (loss / 3).backward()
        losses.append(loss.item())
        update = i % 3 == 2
        if shape == "accumulate" and update:
            optimizer.step()
            optimizer.zero_grad()
        if tracker is not None:
            tracker.end_step()
        if shape == "step_after_block":
            optimizer.step()
            optimizer.zero_grad()
    if tracker is not None:
        tracker.close()
    truth.close()
    return losses, truth


@pytest.mark.parametrize("shape", ["accumulate", "step_after_block"])
def test_a_step_is_an_update(st: SimpleNamespace, published: list[Any], shape: str) -> None:
    plain, _ = _train(st, shape, hook=False)
    losses, truth = _train(st, shape, hook=True)
    assert losses == plain
    updates = MICRO // 3 if shape == "accumulate" else MICRO
    assert truth.updates == updates
    assert [s.step for s in published] == list(range(updates))
    assert all(s.grad_accum_steps == (3 if shape == "accumulate" else 1) for s in published)
    for step in range(3):
        mem = published[step].memory
        assert mem[Component.GRADIENTS.value] == truth.grads[step] > 0
        assert mem[Component.OPTIMIZER_STATES.value] == truth.states[step] > 0


def test_trailing_micro_batches_are_not_a_step(st: SimpleNamespace, published: list[Any]) -> None:
    """Micro-batches after the last update (a run stopped mid-accumulation) publish nothing."""
    model = st.mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = anatomy.track(model, optimizer)
    for i, (x, y) in enumerate(st.batches(5)):
        with tracker.step():
            torch.nn.functional.mse_loss(model(x), y).backward()
            if i == 1:
                optimizer.step()
    tracker.close()
    assert [(s.step, s.grad_accum_steps) for s in published] == [(0, 2)]
