"""Real values where the model reads them: small tensors computed from the batch in the fake step.

A fake tensor has a shape and no values, so any decision a model takes on values cannot be taken
the way the real run takes it. transformers reads values in a few places that change what a step
allocates — whether a padding mask has padding (then it builds a (batch, 1, seq, seq) mask), whether
position ids describe packed sequences — and on a fake tensor it takes the cautious branch (builds
the mask), which a real run with an unpadded batch does not.

:class:`RealIndices` keeps such tensors real: an op whose tensor inputs are all real (or that has
none, like ``arange`` or ``ones``) and whose outputs have at most ``MAX_REAL_NUMEL`` elements each
runs for real. The batch's token ids, attention mask, labels and position ids, and the masks the
model derives from them, are then the real values a training step sees, and the model's own code
decides as it does in training. Everything touching a parameter, and every large tensor, stays
fake. The real tensors are small (8 MiB at most each, a few in all) and are counted in the
timeline like any other allocation.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

MAX_REAL_NUMEL = 1 << 20


def is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor)


def dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``func`` fake, or for real when its inputs are all real and its results small. Call it
    from a dispatch mode above a ``FakeTensorMode(allow_non_fake_inputs=True)``."""
    for a in args:  # the common case, cheaply: a fake tensor among the positional arguments
        if isinstance(a, FakeTensor):
            return func(*args, **kwargs)
    inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if any(isinstance(t, FakeTensor) for t in inputs):
        return func(*args, **kwargs)
    if inputs and func is torch.ops.aten._local_scalar_dense.default:
        with _disable_current_modes():
            return func(*args, **kwargs)
    try:
        fake_out = func(*args, **kwargs)  # the shapes and dtypes, for free
    except (DataDependentOutputException, DynamicOutputShapeException):
        # nonzero, unique, masked_select: the shape depends on the values, which are real here.
        if not all(t.numel() <= MAX_REAL_NUMEL for t in inputs):
            raise
        with _disable_current_modes():
            return func(*args, **kwargs)
    outs = [t for t in tree_leaves(fake_out) if isinstance(t, torch.Tensor)]
    if not outs or not all(t.numel() <= MAX_REAL_NUMEL for t in outs):
        return fake_out
    with _disable_current_modes():
        return func(*args, **kwargs)


class RealIndices(TorchDispatchMode):
    """``dispatch`` as a mode of its own (the fake step's Timeline calls it directly instead, one
    Python layer fewer per op). Enter it inside a ``FakeTensorMode(allow_non_fake_inputs=True)``."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        return dispatch(func, args, kwargs or {})
