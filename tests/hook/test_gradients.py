"""Gradients alive during a traced step."""

from __future__ import annotations

import torch

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
    assert all(not p._post_accumulate_grad_hooks for p in params)  # closed: no hook left behind
