"""FLOPs of one aten op, for the op-group profiler (:mod:`anatomy.hook.opgroups`, whose docstring says how
each group is counted): ``torch.utils.flop_counter``'s formulas for contractions and attention, the CPU
flash-attention kernel they do not know, and per-element estimates for the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

try:  # the wrapper torch puts round each formula that takes shapes (its code object, shared by them all)
    from torch.utils.flop_counter import shape_wrapper as _shape_wrapper

    _SHAPE_WRAPPED: Any = _shape_wrapper(lambda: None).__code__
except Exception:  # another torch: every formula through its own wrapper
    _SHAPE_WRAPPED = None

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
    if isinstance(value, torch.Tensor):
        return value.numel()
    return max((t.numel() for t in _tensors(value)), default=0)


def _sum_numel(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel()
    return sum(t.numel() for t in _tensors(value))


def _normalization(args: tuple[Any, ...], out: Any) -> float:
    return float(NORMALIZATION_FLOPS_PER_ELEMENT * _max_numel(out))


def _fused(args: tuple[Any, ...], out: Any) -> float:
    return float(FUSED_ADAM_FLOPS_PER_ELEMENT * (_sum_numel(args[0]) if args else 0))


def _foreach(args: tuple[Any, ...], out: Any) -> float:
    # In-place foreach ops return None: count the elements of the list they update.
    n = _sum_numel(out) if out is not None else 0
    return float(ELEMENTWISE_FLOPS_PER_ELEMENT * (n or (_sum_numel(args[0]) if args else 0)))


def _reduction(args: tuple[Any, ...], out: Any) -> float:
    return float(ELEMENTWISE_FLOPS_PER_ELEMENT * (_max_numel(args[0]) if args else 0))


def _elementwise(args: tuple[Any, ...], out: Any) -> float:
    return float(ELEMENTWISE_FLOPS_PER_ELEMENT * _max_numel(out))


def _estimator(group: OpGroup, name: str) -> Callable[[tuple[Any, ...], Any], float]:
    """The per-element estimate for an op of ``group`` (not a contraction, not OTHER) named ``name``:
    (args, out) -> FLOPs."""
    if group is OpGroup.NORMALIZATION:
        return _normalization
    if name.startswith(("_fused_adam", "_fused_sgd", "_fused_adagrad")):
        return _fused
    if name.startswith("_foreach_"):
        return _foreach
    if name in _REDUCTIONS:
        return _reduction
    return _elementwise


# Counts one call of an op: (args, kwargs, out) -> FLOPs.
Counter = Callable[[tuple[Any, ...], dict[str, Any], Any], float]


def _zero(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> float:
    return 0.0


def _shapes(value: Any) -> Any:
    """``value`` with its tensors as their shapes, as ``tree_map(get_shape, value)`` gives it, for a
    tensor, a leaf, or a plain list or tuple of them; ``_NESTED`` for anything deeper (the caller then
    leaves the mapping to torch's wrapper)."""
    if isinstance(value, torch.Tensor):
        return value.shape
    kind = type(value)
    if kind is list or kind is tuple:
        items = []
        for v in value:
            if isinstance(v, torch.Tensor):
                items.append(v.shape)
            elif isinstance(v, (list, tuple, dict)):
                return _NESTED
            else:
                items.append(v)
        return items if kind is list else tuple(items)
    if isinstance(value, (list, tuple, dict)):  # a named tuple, a dict: pytree nodes
        return _NESTED
    return value


_NESTED = object()


def _shaped(raw: Callable[..., Any], wrapped: Callable[..., Any]) -> Counter:
    """A counter calling the formula ``raw`` with shapes mapped here: what torch's wrapper (``wrapped``)
    does with a pytree map per call, at a fraction of its cost (an ``addmm``: 68 µs through the wrapper).
    Anything nested goes through the wrapper as before."""

    def count(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> float:
        shaped = []
        for a in args:
            s = _shapes(a)
            if s is _NESTED:
                return float(wrapped(*args, **kwargs, out_val=out))
            shaped.append(s)
        named = {}
        for k, v in kwargs.items():
            s = _shapes(v)
            if s is _NESTED:
                return float(wrapped(*args, **kwargs, out_val=out))
            named[k] = s
        out_shape = _shapes(out)
        if out_shape is _NESTED:
            return float(wrapped(*args, **kwargs, out_val=out))
        return float(raw(*shaped, out_shape=out_shape, **named))

    return count


def counter_for(func: Any, group: OpGroup, name: str, map_shapes: bool = True) -> Counter:
    """How to count the FLOPs of calls of ``func`` (an op of ``group``, base name ``name``): chosen once
    per op, so that a call costs the formula and no lookups. ``map_shapes``: torch's shape formulas get
    the shapes mapped here (:func:`_shaped`), else their own wrapper's."""
    packet = func.overloadpacket
    formula = flop_registry.get(packet)
    if formula is not None:
        raw = getattr(formula, "__wrapped__", None)
        if map_shapes and raw is not None and getattr(formula, "__code__", None) is _SHAPE_WRAPPED:
            return _shaped(raw, formula)
        # flop_registry formulas take the raw args plus out_val (they map tensors to shapes)
        return lambda args, kwargs, out: float(formula(*args, **kwargs, out_val=out))
    extra = _EXTRA_FORMULAS.get(packet)
    if extra is not None:
        return lambda args, kwargs, out: float(extra(*args, **kwargs))
    if group is OpGroup.CONTRACTION or group is OpGroup.OTHER:
        return _zero  # (an unknown contraction kernel: better no number than a wrong one; others move data)
    estimate = _estimator(group, name)
    return lambda args, kwargs, out: estimate(args, out)


def flops_of(
    func: Any, group: OpGroup, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any
) -> float:
    """The FLOPs of one call, counted as :func:`counter_for` counts them but with torch's formulas through
    torch's own shape wrapper (its pytree map): the reference the shapes mapped here are tested against."""
    return counter_for(func, group, name, map_shapes=False)(args, kwargs, out)
