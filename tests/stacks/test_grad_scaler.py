"""An fp16-style ``GradScaler`` that skips the optimizer step on inf/NaN gradients: the skipped block is a
micro-batch of the next step that updates, so published steps equal the optimizer's real updates (the
test's own post-hook count) and the figures match the training process's own sums."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

import anatomy
from anatomy.vocabulary import Component

BLOCKS = 8
SKIPPED = (2, 5)  # blocks whose gradients get an inf: the scaler skips their optimizer step


def _train(st: SimpleNamespace, hook: bool) -> tuple[list[float], Any, list[float]]:
    model = st.mlp(seed=0, width=32, depth=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    truth = st.Truth(model, [optimizer])
    tracker = anatomy.track(model, optimizer) if hook else None
    losses: list[float] = []
    scales: list[float] = []
    for i, (x, y) in enumerate(st.batches(BLOCKS)):
        if tracker is not None:
            tracker.begin_step(samples=len(x))
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if i in SKIPPED:
            with torch.no_grad():
                next(model.parameters()).grad[0, 0] = float("inf")  # an overflow, as fp16 gets
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
        scales.append(scaler.get_scale())
        if tracker is not None:
            tracker.end_step()
    if tracker is not None:
        tracker.close()
    truth.close()
    return losses, truth, scales


def test_skipped_steps_join_the_next_update(st: SimpleNamespace, published: list[Any]) -> None:
    plain_losses, _, plain_scales = _train(st, hook=False)
    losses, truth, scales = _train(st, hook=True)
    assert losses == plain_losses and scales == plain_scales  # bit-identical; the scaler skipped alike
    assert scales[SKIPPED[0]] < scales[SKIPPED[0] - 1]  # (the scaler did skip: it lowered its scale)
    assert truth.updates == BLOCKS - len(SKIPPED)
    assert [s.step for s in published] == list(range(truth.updates))
    # block 2 was skipped: update 2 is blocks 2 and 3; block 5 skipped: update 4 is blocks 5 and 6
    assert [s.grad_accum_steps for s in published] == [1, 1, 2, 1, 2, 1]
    for step in range(3):
        mem = published[step].memory
        assert mem[Component.GRADIENTS.value] == truth.grads[step] > 0
        assert mem[Component.OPTIMIZER_STATES.value] == truth.states[step] > 0
    assert published[-1].memory[Component.OPTIMIZER_STATES.value] == truth.states[-1]
