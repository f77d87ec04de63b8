"""Mixture-of-experts models on fake tensors: the experts' grouped matmul, and what routing changes.

transformers runs the experts of Mixtral, Qwen2-MoE, DeepSeek-V3, gpt-oss, ... through one grouped
matmul (``experts_implementation="grouped_mm"``, its default): the tokens of a batch are sorted by
the expert top-k routing picked for them and ``torch.nn.functional.grouped_mm`` multiplies each
group by its expert's weights. On CPU the kernel takes float32, but the fake (meta) kernel torch
registers checks for the CUDA kernel's bfloat16 only, so a float32 fake step failed ("Expected
inputs of BF16 type"). During the fake step such calls go to transformers' own fallback operator
for the same product, which has a fake kernel: same output (tokens x k rows), same tensors saved
for backward (the sorted inputs and the expert weights), same gradient shapes.

Routing. Whatever experts the router picks, a grouped matmul sees tokens x k rows in all and every
expert's full weight (and gradient) tensors, so weights, gradients, optimizer states and the
activations the experts save do not depend on the routing: the expected and the worst case (all
tokens on the same experts) are the same bytes. ``routing_note`` says so in the plan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_ROUTED_ATTRS = ("num_local_experts", "num_experts", "n_routed_experts")
_TOP_K_ATTRS = ("num_experts_per_tok", "top_k", "moe_topk")


def experts_of(config: Any) -> tuple[int, int] | None:
    """(routed experts, experts per token) of a mixture-of-experts config; None for a dense one."""
    experts = next(
        (getattr(config, a) for a in _ROUTED_ATTRS if isinstance(getattr(config, a, None), int)), 0
    )
    top_k = next((getattr(config, a) for a in _TOP_K_ATTRS if isinstance(getattr(config, a, None), int)), 0)
    if experts > 1 and top_k >= 1:
        return experts, top_k
    return None


def routing_note(config: Any) -> str | None:
    moe = experts_of(config)
    if moe is None:
        return None
    experts, top_k = moe
    return (
        f"mixture of experts: {experts} experts, top-{top_k} routing; all experts' weights, gradients "
        f"and optimizer states are counted, and the routed experts save tokens x {top_k} rows whatever "
        "the routing, so the expected and the worst case (every token on the same experts) are the "
        "same bytes (shown)"
    )


@contextlib.contextmanager
def fake_grouped_mm() -> Iterator[None]:
    """Route float32/float16 grouped matmuls through transformers' fallback operator (fake-capable)."""
    import torch.nn.functional as F

    original = getattr(F, "grouped_mm", None)
    if original is None:
        yield
        return

    def grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        offs = kwargs.get("offs", args[0] if args else None)
        if (
            mat_a.dtype is not torch.bfloat16
            and offs is not None
            and mat_a.dim() == 2
            and mat_b.dim() == 3
            and kwargs.get("bias") is None
            and kwargs.get("out_dtype") is None
            and len(args) <= 1
        ):
            import transformers.integrations.moe  # noqa: F401  (registers the operator)

            return torch.ops.transformers.grouped_mm_fallback(mat_a, mat_b, offs)
        return original(mat_a, mat_b, *args, **kwargs)

    F.grouped_mm = grouped_mm
    try:
        yield
    finally:
        F.grouped_mm = original
