"""The hook's distributed pieces in one process (the real multi-process jobs are in tests/distributed/):
the user's model class seen through wrappers, and a parameter outside the model that is not FSDP's."""

from __future__ import annotations

import torch
from torch import nn

import anatomy
from anatomy.hook.distributed import Buckets, communication_bytes
from anatomy.hook.hello import model_class_name
from anatomy.vocabulary import Component


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_the_model_class_is_the_users_through_fsdp2s_generated_class() -> None:
    from torch.distributed.fsdp import FSDPModule

    generated = type("FSDPNet", (FSDPModule, Net), {})  # what fully_shard makes of Net
    model = Net()
    model.__class__ = generated
    assert model_class_name(model) == "Net"
    assert model_class_name(Net()) == "Net"


def test_a_learnable_parameter_outside_a_plain_model_is_not_an_unsharded_parameter() -> None:
    model = Net()
    temperature = nn.Parameter(torch.ones(()))  # used by the loss, not part of the model
    opt = torch.optim.AdamW([*model.parameters(), temperature])
    tracker = anatomy.track(model, opt, publish=False, sample_every=1)
    for _ in range(3):
        with tracker.step(samples=8):
            x = torch.randn(8, 32)
            loss = (model(x) * temperature).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
    snap = tracker.latest
    tracker.close()
    assert snap is not None and snap.error is None
    assert snap.memory.get(Component.UNSHARDED_PARAMETERS.value) is None  # no FSDP, no such row
    assert snap.memory.get(Component.COMMUNICATION_BUFFERS.value) is None  # no DDP either


def test_ddp_buckets_are_buffers_unless_they_are_the_gradients() -> None:
    assert communication_bytes(None, 0) is None
    assert communication_bytes(Buckets(1000, are_gradients=False), 1000) == 1000  # a second copy
    assert communication_bytes(Buckets(1000, are_gradients=True), 1000) == 0  # the gradients themselves
    assert communication_bytes(Buckets(1000, are_gradients=True), 0) == 1000  # before backward / set_to_none
