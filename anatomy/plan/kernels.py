"""CUDA kernels on fake CPU tensors: what the CUDA target keeps that CPU kernels do not.

The fake step runs on CPU fake tensors, so by default it keeps what CPU kernels keep. For the CUDA
target, a handful of functions are swapped for stand-ins that allocate what their CUDA kernels
allocate: dropout's 1-byte mask (``native_dropout``) instead of a float noise tensor, the fused
memory-efficient attention kernel (the output and a logsumexp row saved, not the seq x seq
probabilities; a boolean mask becomes one float bias per call, as torch converts it), and CUDA
autocast's float32 policy for softmax, log_softmax and layer_norm.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

_PATCH_LOCK = threading.Lock()


@contextlib.contextmanager
def cuda_kernels(fused_attention: bool) -> Iterator[None]:
    """Make fake CPU tensors keep what CUDA kernels keep: dropout's 1-byte mask, fused attention, and
    CUDA autocast's float32 policy for softmax, log_softmax and layer_norm (CPU autocast leaves them in
    half precision; CUDA autocast computes them in, and returns, float32).

    The functions are swapped on ``torch.nn.functional``, ``torch`` and ``torch.Tensor`` for the
    duration of the run (not with a TorchFunctionMode: checkpointing recomputes inside backward, where
    such a mode is not active, and a recompute that differs from the forward is an error). The swap
    is process-wide: do not plan for the CUDA target on one thread while the same process trains on
    another.
    """
    import torch.nn.functional as F

    swaps: list[tuple[Any, str, Any]] = [
        (F, "dropout", _cuda_dropout),
        (F, "scaled_dot_product_attention", _cuda_sdpa if fused_attention else _cuda_sdpa_math),
    ]
    for owner, name in (
        (F, "softmax"),
        (F, "log_softmax"),
        (F, "layer_norm"),
        (torch, "softmax"),
        (torch, "log_softmax"),
        (torch.Tensor, "softmax"),
        (torch.Tensor, "log_softmax"),
    ):
        swaps.append((owner, name, _fp32_under_autocast(getattr(owner, name))))
    with _PATCH_LOCK:
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
        try:
            for owner, name, fn in swaps:
                setattr(owner, name, fn)
            yield
        finally:
            for owner, name, fn in originals:
                setattr(owner, name, fn)


def _fp32_under_autocast(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with CUDA autocast's fp32 policy: half-precision tensor arguments are cast to float32."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.is_autocast_enabled("cpu") and any(
            isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) for a in args
        ):
            args = tuple(
                a.float() if isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) else a
                for a in args
            )
            with torch.autocast("cpu", enabled=False):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return run


def _cuda_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    if not training or p == 0.0:
        return input
    return torch.native_dropout(input, p, True)[0]


def _expand_kv_heads(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention: repeat the key/value heads up to the query heads, as the kernels do."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        reps = query.shape[-3] // key.shape[-3]
        return key.repeat_interleave(reps, dim=-3), value.repeat_interleave(reps, dim=-3)
    return key, value


def _cuda_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    key, value = _expand_kv_heads(query, key, value, enable_gqa)
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            # As torch converts it (one bias per call); built from the query so it stays fake.
            bias = query.new_zeros(attn_mask.shape).masked_fill_(~attn_mask, float("-inf"))
        else:
            bias = attn_mask.to(query.dtype)
        bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, True, dropout_p, is_causal, scale=scale
    )
    return out[0]


def _cuda_sdpa_math(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Unfused attention as CUDA runs it: the probabilities are saved, their dropout keeps a 1-byte mask."""
    key, value = _expand_kv_heads(query, key, value, enable_gqa)
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        s_q, s_k = query.shape[-2], key.shape[-2]
        causal = torch.ones(s_q, s_k, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = (
            scores.masked_fill(~attn_mask, float("-inf"))
            if attn_mask.dtype == torch.bool
            else scores + attn_mask
        )
    probs = torch.softmax(scores, dim=-1)
    probs = _cuda_dropout(probs, dropout_p, True)
    return torch.matmul(probs, value)
