"""accelerate with gradient accumulation, in both loop shapes the README shows: ``tracker.step()``
around each micro-batch (accelerate skips the optimizer step on non-sync micro-batches) and around
each optimizer step. Published steps, micro-batches, gradients and optimizer states are compared with
the training process's own count; losses with the same loop without the hook."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import accelerate
import pytest
import torch

import anatomy
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
