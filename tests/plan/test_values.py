"""Real values in the fake step (anatomy.plan.values): small tensors computed from the batch stay
real, so the model's data-dependent decisions are the real run's; everything else stays fake."""

from __future__ import annotations

import pytest
import torch

# FakeTensorMode and its exception have no public name in torch: RealIndices runs inside that mode.
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

from anatomy.plan.values import MAX_REAL_NUMEL, RealIndices, is_fake


def test_small_tensors_from_real_inputs_stay_real() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True), RealIndices():
        mask = torch.ones(2, 6, dtype=torch.long)
        mask[1, 4:] = 0
        positions = torch.arange(6).expand(2, -1)
        padded = not bool(mask.all())  # a value read: works on a real tensor
        kept = mask.nonzero()  # a data-dependent shape
        floats = torch.ones(3, 3)  # a float factory: small, real
    assert padded and kept.shape == (10, 2)
    assert not is_fake(positions) and not is_fake(floats)


def test_large_or_parameter_touching_tensors_stay_fake() -> None:
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        weight = torch.randn(4, 4)  # built before RealIndices: fake, like the model's parameters
        with RealIndices():
            ids = torch.tensor([0, 2, 3])
            rows = weight[ids]  # a fake weight indexed by real ids: fake
            big = torch.zeros(MAX_REAL_NUMEL + 1, dtype=torch.bool)  # too large to be real
            with pytest.raises(DataDependentOutputException):
                bool(rows.sum() > 0)  # a fake value is still not readable
    assert is_fake(weight) and weight.fake_mode is mode
    assert is_fake(rows) and is_fake(big)
    assert not is_fake(ids)
