"""What the training set-up is, detected from the objects themselves: precision, optimizer, OOM."""

from __future__ import annotations

from typing import Any

import torch

from anatomy.hook.tensors import dominant_dtype, unwrap_optimizer
from anatomy.vocabulary import OptimizerKind, Precision


def detect_precision(
    model: torch.nn.Module | None = None,
    *,
    param_dtype: torch.dtype | None = None,
    autocast_dtype: torch.dtype | None = None,
    grad_scaler: bool = False,
) -> Precision:
    """fp16/bf16 parameters -> pure half precision; fp32 parameters under autocast (or with a
    GradScaler, which only fp16 mixed precision uses) -> *_MIXED; else FP32."""
    if param_dtype is None:
        param_dtype = dominant_dtype(model) if model is not None else torch.float32
    if param_dtype == torch.float16:
        return Precision.FP16
    if param_dtype == torch.bfloat16:
        return Precision.BF16
    if autocast_dtype == torch.float16 or (autocast_dtype is None and grad_scaler):
        return Precision.FP16_MIXED
    if autocast_dtype == torch.bfloat16:
        return Precision.BF16_MIXED
    return Precision.FP32


def active_autocast_dtype(device_type: str) -> torch.dtype | None:
    """The low-precision dtype autocast uses right now on this device type, or None when it is off."""
    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except (RuntimeError, TypeError, AttributeError):
        return None
    return None


def detect_optimizer(optimizer: Any) -> OptimizerKind:
    if optimizer is None:
        return OptimizerKind.NONE
    opt = unwrap_optimizer(optimizer)
    name = type(opt).__name__.lower()
    module = type(opt).__module__.lower()
    bits = getattr(getattr(opt, "args", None), "optim_bits", None)
    if "8bit" in name or bits == 8:
        return OptimizerKind.ADAMW_8BIT if "adam" in name else OptimizerKind.OTHER
    if "adafactor" in name:
        return OptimizerKind.ADAFACTOR
    if name in ("adamw", "adam", "fusedadam", "nadam", "radam", "adamax") or (
        "adam" in name and "bitsandbytes" in module
    ):
        return OptimizerKind.ADAMW
    if name == "sgd":
        groups = getattr(opt, "param_groups", [])
        momentum = any(float(g.get("momentum", 0) or 0) > 0 for g in groups)
        return OptimizerKind.SGD_MOMENTUM if momentum else OptimizerKind.SGD
    return OptimizerKind.OTHER


# torch.OutOfMemoryError from torch 2.5 on; torch.cuda.OutOfMemoryError (the same class) before.
_OOM_ERROR: type[BaseException] = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def is_oom(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, Python's MemoryError, or any error whose text says it ran out."""
    if isinstance(exc, (_OOM_ERROR, MemoryError)):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text
