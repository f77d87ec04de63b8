"""The set-up detected from the objects: optimizer kind through wrappers, precision, OOM errors."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from anatomy.hook.detect import detect_optimizer, detect_precision, is_oom
from anatomy.hook.tensors import unwrap_optimizer
from anatomy.vocabulary import OptimizerKind, Precision


def test_unwrap_and_detect_through_wrappers() -> None:
    p = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.AdamW([p])
    wrapper = SimpleNamespace(optimizer=opt)  # the shape of accelerate's AcceleratedOptimizer
    assert unwrap_optimizer(wrapper) is opt
    assert detect_optimizer(wrapper) is OptimizerKind.ADAMW
    assert detect_optimizer(None) is OptimizerKind.NONE
    assert detect_optimizer(torch.optim.Adagrad([p])) is OptimizerKind.OTHER


def test_detect_precision() -> None:
    assert detect_precision(param_dtype=torch.float32) is Precision.FP32
    assert detect_precision(param_dtype=torch.float32, autocast_dtype=torch.bfloat16) is Precision.BF16_MIXED
    assert detect_precision(param_dtype=torch.float32, autocast_dtype=torch.float16) is Precision.FP16_MIXED
    assert detect_precision(param_dtype=torch.float32, grad_scaler=True) is Precision.FP16_MIXED
    assert detect_precision(param_dtype=torch.bfloat16) is Precision.BF16
    assert detect_precision(torch.nn.Linear(2, 2).half()) is Precision.FP16


def test_is_oom() -> None:
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"))
    assert is_oom(MemoryError())
    assert not is_oom(ValueError("shapes do not match"))
