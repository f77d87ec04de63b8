"""FLOPs of one aten op, for the op-group profiler (:mod:`anatomy.hook.opgroups`, whose docstring says how
each group is counted): ``torch.utils.flop_counter``'s formulas for contractions and attention, the CPU
flash-attention kernel they do not know, and per-element estimates for the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from anatomy.vocabulary import OpGroup

ELEMENTWISE_FLOPS_PER_ELEMENT = 1
NORMALIZATION_FLOPS_PER_ELEMENT = 5
FUSED_ADAM_FLOPS_PER_ELEMENT = 12

# Reductions read many elements and write few: count their input, not their output.
_REDUCTIONS = frozenset(
    {"sum", "mean", "prod", "amax", "amin", "max", "min", "var", "std", "var_mean", "std_mean", "norm",
     "linalg_vector_norm", "logsumexp", "argmax", "argmin"}
)  # fmt: skip


aten = torch.ops.aten


def _shape(x: Any) -> Any:
    return x.shape if isinstance(x, torch.Tensor) else x


def _cpu_flash_flops(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
    return int(sdpa_flop_count(_shape(query), _shape(key), _shape(value)))


def _cpu_flash_backward_flops(grad_out: Any, query: Any, key: Any, value: Any, *a: Any, **k: Any) -> int:
    return int(sdpa_backward_flop_count(_shape(grad_out), _shape(query), _shape(key), _shape(value)))


# Kernels FlopCounterMode does not count (it reports 0 FLOPs for attention on CPU): raw-args formulas.
_EXTRA_FORMULAS: dict[Any, Callable[..., int]] = {}
for _packet_name, _formula in (
    ("_scaled_dot_product_flash_attention_for_cpu", _cpu_flash_flops),
    ("_scaled_dot_product_flash_attention_for_cpu_backward", _cpu_flash_backward_flops),
):
    if hasattr(aten, _packet_name):
        _EXTRA_FORMULAS[getattr(aten, _packet_name)] = _formula


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v


def _max_numel(value: Any) -> int:
    return max((t.numel() for t in _tensors(value)), default=0)


def _sum_numel(value: Any) -> int:
    return sum(t.numel() for t in _tensors(value))


def _estimated_flops(group: OpGroup, name: str, args: tuple[Any, ...], out: Any) -> float:
    if group is OpGroup.OTHER:
        return 0.0
    if group is OpGroup.NORMALIZATION:
        return float(NORMALIZATION_FLOPS_PER_ELEMENT * _max_numel(out))
    if name.startswith(("_fused_adam", "_fused_sgd", "_fused_adagrad")):
        return float(FUSED_ADAM_FLOPS_PER_ELEMENT * (_sum_numel(args[0]) if args else 0))
    if name.startswith("_foreach_"):
        # In-place foreach ops return None: count the elements of the list they update.
        n = _sum_numel(out) if out is not None else 0
        return float(ELEMENTWISE_FLOPS_PER_ELEMENT * (n or (_sum_numel(args[0]) if args else 0)))
    if name in _REDUCTIONS:
        return float(ELEMENTWISE_FLOPS_PER_ELEMENT * (_max_numel(args[0]) if args else 0))
    return float(ELEMENTWISE_FLOPS_PER_ELEMENT * _max_numel(out))


def flops_of(
    func: Any, group: OpGroup, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> float:
    packet = func.overloadpacket
    formula = flop_registry.get(packet)
    if formula is not None:
        # flop_registry formulas take the raw args plus out_val (they map tensors to shapes).
        return float(formula(*args, **kwargs, out_val=out))
    extra = _EXTRA_FORMULAS.get(packet)
    if extra is not None:
        return float(extra(*args, **kwargs))
    if group is OpGroup.CONTRACTION:
        return 0.0  # an unknown contraction kernel: better no number than a wrong one
    return _estimated_flops(group, name, args, out)
