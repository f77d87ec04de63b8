"""Gradients alive during a traced step."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch

import anatomy
from anatomy.hook.gradients import GradientWatcher
from anatomy.hook.tensors import gradient_bytes


def test_gradient_watcher_counts_gradients_as_they_appear() -> None:
    lin1, lin2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)
    params = [*lin1.parameters(), *lin2.parameters()]
    watch = GradientWatcher(params)
    assert watch.bytes == 0
    lin2(lin1(torch.randn(8, 16))).sum().backward()
    assert watch.bytes == gradient_bytes(params) == sum(p.numel() * 4 for p in params)
    lin2(lin1(torch.randn(8, 16))).sum().backward()  # accumulates into the same tensors: no change
    assert watch.bytes == gradient_bytes(params)
    torch.optim.SGD(params, lr=0.1).zero_grad(set_to_none=True)  # freed: no longer held
    assert watch.bytes == 0
    lin2(lin1(torch.randn(8, 16))).sum().backward()  # new gradient tensors: counted once more
    assert watch.bytes == gradient_bytes(params) == sum(p.numel() * 4 for p in params)
    watch.close()
    # Closed: nothing left behind on the parameters (a tensor's post-accumulate hook would stay in C++ and
    # take the GIL on every later backward), the parameters let go, nothing of ours runs again.
    assert all(p._post_accumulate_grad_hooks is None and p._backward_hooks is None for p in params)
    assert watch._params == []
    calls: list[torch.Tensor] = []
    watch._watch = calls.append  # type: ignore[method-assign,assignment]
    lin2(lin1(torch.randn(8, 16))).sum().backward()
    assert calls == []


def _grad(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None
    return p.grad


def test_gradient_watcher_composes_with_the_users_gradient_hooks() -> None:
    """A user's post-accumulate hook and a hook on the same accumulator still run, each once, with the
    watch on and after it closed; the gradients are the same as without the watch."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    x = torch.randn(5, 8)
    lin(x).sum().backward()
    expected = [_grad(p).clone() for p in lin.parameters()]
    lin.zero_grad(set_to_none=True)
    seen: list[str] = []
    for name, p in lin.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: seen.append(name))
    watch = GradientWatcher(lin.parameters())
    lin(x).sum().backward()
    assert sorted(seen) == ["bias", "weight"]
    assert watch.bytes == sum(p.numel() * 4 for p in lin.parameters())
    assert all(torch.equal(_grad(p), e) for p, e in zip(lin.parameters(), expected, strict=True))
    watch.close()
    seen.clear()
    lin.zero_grad(set_to_none=True)
    lin(x).sum().backward()
    assert sorted(seen) == ["bias", "weight"]
    assert all(torch.equal(_grad(p), e) for p, e in zip(lin.parameters(), expected, strict=True))


def test_a_traced_step_leaves_no_gradient_hook_on_the_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace's gradient watch runs on traced steps and leaves every parameter as it found it: no
    tensor-level hook that later backward passes would call (``anatomy.hook.gradients``' docstring)."""
    from anatomy.hook import sampled

    made: list[GradientWatcher] = []

    class Counted(GradientWatcher):
        def __init__(self, params: Iterable[torch.Tensor]) -> None:
            super().__init__(params)
            made.append(self)

    monkeypatch.setattr(sampled, "GradientWatcher", Counted)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracker = anatomy.track(model, opt, publish=False, sample_every=4, record=False)
    for _ in range(24):
        with tracker.step():
            model(torch.randn(8, 16)).square().mean().backward()
            opt.step()
            opt.zero_grad()
    tracker.close()
    assert made, "no step was traced"
    assert all(w._params == [] for w in made)
    params = list(model.parameters())
    assert all(p._post_accumulate_grad_hooks is None and p._backward_hooks is None for p in params)


def test_in_a_forward_only_the_first_read_looks_at_the_parameters() -> None:
    """A forward makes no gradient: after the tracker's boundary into one, its first read finds what an
    earlier micro-batch's backward left and later reads look at no parameter; a gradient freed in it is
    uncounted as it dies all the same; in backward every read looks."""
    from anatomy.vocabulary import Phase

    lin = torch.nn.Linear(8, 8)
    params = list(lin.parameters())
    watch = GradientWatcher(params)
    scans: list[int] = []
    scan = watch._scan

    def counted() -> None:
        scans.append(1)
        scan()

    watch._scan = counted  # type: ignore[method-assign]
    lin(torch.randn(2, 8)).sum().backward()  # (a first micro-batch: gradients made before the forward)
    watch.phase_begins(Phase.FORWARD)
    assert watch.bytes == gradient_bytes(params) and len(scans) == 1
    for _ in range(5):
        assert watch.bytes == gradient_bytes(params)
    assert len(scans) == 1  # (the forward's later reads: no look)
    lin.weight.grad = None  # (freed in the forward: its death is counted)
    assert watch.bytes == gradient_bytes(params) == 8 * 4 and len(scans) == 1
    watch.phase_begins(Phase.BACKWARD)
    lin(torch.randn(2, 8)).sum().backward()
    assert watch.bytes == gradient_bytes(params) and len(scans) == 2
    assert watch.bytes == gradient_bytes(params) and len(scans) == 3  # (in backward: every read looks)
    watch.phase_begins(Phase.FORWARD)  # (the next micro-batch's forward: its first read looks again)
    assert watch.bytes == gradient_bytes(params) and len(scans) == 4
    watch.close()
