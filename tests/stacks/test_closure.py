"""Closure-style optimizer steps (``optimizer.step(closure)``: LBFGS, and any loop written that way):
forward, backward and the optimizer's own work each timed once per step, summing to the step; gradients
read after this step's backward; the user's closure called exactly as often as without the hook."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import anatomy
from anatomy.hook.schedule import WARMUP_REFRESH_STEPS
from anatomy.vocabulary import Component

STEPS = 8
WIDTH = 384


def _train(st: SimpleNamespace, make_opt: Any, hook: bool) -> tuple[list[float], int, Any]:
    """(losses, closure calls, truth) of STEPS closure-style steps."""
    # wide enough that a step takes milliseconds: the fixed costs outside the phases (zero_grad, the
    # hooks) are then well under the 5% the phases' sum may miss the step by
    model = st.mlp(seed=0, width=WIDTH, depth=3)
    optimizer = make_opt(model.parameters())
    truth = st.Truth(model, [optimizer])
    tracker = anatomy.track(model, optimizer) if hook else None
    data = st.batches(STEPS, batch=64, width=WIDTH)
    losses: list[float] = []
    calls = 0
    for x, y in data:

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            nonlocal calls
            calls += 1
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        if tracker is not None:
            with tracker.step(samples=len(x)):
                losses.append(float(optimizer.step(closure)))
        else:
            losses.append(float(optimizer.step(closure)))
    if tracker is not None:
        tracker.close()
    truth.close()
    return losses, calls, truth


@pytest.mark.parametrize(
    "make_opt",
    [
        pytest.param(lambda p: torch.optim.LBFGS(p, lr=0.1, max_iter=4), id="lbfgs"),
        pytest.param(lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9), id="sgd"),
    ],
)
def test_closure_steps(st: SimpleNamespace, published: list[Any], make_opt: Any) -> None:
    plain_losses, plain_calls, _ = _train(st, make_opt, hook=False)
    losses, calls, truth = _train(st, make_opt, hook=True)
    assert losses == plain_losses and calls == plain_calls  # bit-identical, the closure as often
    assert truth.updates == STEPS
    assert [s.step for s in published] == list(range(STEPS))
    first = published[0].memory
    assert first[Component.GRADIENTS.value] == truth.grads[0] > 0  # after this step's backward
    assert first[Component.OPTIMIZER_STATES.value] == truth.states[0] > 0
    for snap in published:
        assert snap.grad_accum_steps == 1  # LBFGS re-evaluating its closure is not a micro-batch
        assert snap.memory[Component.ACTIVATIONS.value]
    # steady-state steps: the first ones re-sum every tensor and read the heap, and step 1 runs the
    # op-group profiler — the hook's own work, outside the phases by design
    for snap in published[WARMUP_REFRESH_STEPS:]:
        t = snap.timing
        assert t.step_s and t.forward_s and t.backward_s and t.optimizer_s
        assert st.phases_sum(snap) == pytest.approx(t.step_s, rel=0.05)


def test_closure_exception_propagates_unchanged(st: SimpleNamespace, published: list[Any]) -> None:
    model = st.mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = anatomy.track(model, optimizer)

    class Boom(Exception):
        pass

    def closure() -> torch.Tensor:
        raise Boom("the user's own")

    with pytest.raises(Boom, match="the user's own"), tracker.step():
        optimizer.step(closure)
    tracker.close()
    assert tracker.error is None


def test_updates_without_a_tracked_forward_are_reported(
    st: SimpleNamespace, published: list[Any], caplog: Any
) -> None:
    """A tracked module whose forward the loop never calls (Lightning's ``self.model(...)`` inside
    ``training_step`` with ``track(self)``): one warning naming the way out, never silence."""
    outer = torch.nn.Module()
    outer.inner = st.mlp()
    optimizer = torch.optim.SGD(outer.parameters(), lr=0.1)
    tracker = anatomy.track(outer, optimizer)
    for x, y in st.batches(5):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(outer.inner(x), y).backward()
        optimizer.step()
    tracker.close()
    assert published == []
    warnings = [r.getMessage() for r in caplog.records if "no training-mode forward" in r.getMessage()]
    assert len(warnings) == 1 and "anatomy.lightning.AnatomyCallback" in warnings[0]
