"""Quantized weights (bitsandbytes): their logical size, their quantization state, their format.

A 4-bit ``Params4bit`` stores two weights per uint8 element: its ``numel()`` is half the weights (less
with padding), the layer's real shape is ``quant_state.shape``. The dequantization needs the state's
tensors (block scales ``absmax``, the ``code`` book, the ``offset``, and with nested quantization a second
state quantizing the scales), which live outside the module's parameters and buffers. An 8-bit
``Int8Params`` keeps its row scales in ``SCB`` (and its int8 matrix in ``CB``, the parameter's own
storage) until the layer's first forward moves both to the layer's ``state`` (a ``MatmulLtState``).
Nothing here imports bitsandbytes: the attributes are read duck-typed, so a model without it costs one
``getattr`` per parameter, on the steps that re-sum the weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

_INT8_ATTRS = ("CB", "SCB")


def quant_state_of(p: torch.Tensor) -> Any:
    """A 4-bit parameter's quantization state (bitsandbytes ``QuantState``), or None."""
    qs = getattr(p, "quant_state", None)
    return qs if qs is not None and hasattr(qs, "absmax") else None


def _state_tensors(qs: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    # A QuantState holds tensors and a nested state (``state2``: the scales, quantized again).
    if qs is None or depth > 2:
        return
    try:
        items = list(vars(qs).values())
    except TypeError:  # a state with __slots__: its known tensors
        items = [getattr(qs, name, None) for name in ("absmax", "code", "offset", "state2")]
    for value in items:
        if isinstance(value, torch.Tensor):
            yield value
        elif value is not None and hasattr(value, "absmax"):
            yield from _state_tensors(value, depth + 1)


def quantization_tensors(p: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a quantized parameter needs besides its own storage (empty for a plain one)."""
    out = list(_state_tensors(quant_state_of(p)))
    for name in _INT8_ATTRS:
        value = getattr(p, name, None) if _is_int8(p) else None
        if isinstance(value, torch.Tensor):
            out.append(value)
    return out


def layer_state_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """An 8-bit layer's matmul state (``Linear8bitLt.state``: ``CB``, ``SCB`` after its first forward)."""
    # bitsandbytes sets ``state`` in the layer's __dict__; a module without one there and no class attribute
    # of that name has none (getattr would go through Module.__getattr__ and its AttributeError: ~2 µs a
    # module, a millisecond a re-sum of a few hundred modules)
    state = module.__dict__.get("state")
    if state is None and hasattr(type(module), "state"):
        try:
            state = getattr(module, "state", None)
        except Exception:  # a module's own ``state`` property that fails: not bitsandbytes'
            return []
    if state is None or type(state).__name__ != "MatmulLtState":
        return []
    return [t for t in (getattr(state, name, None) for name in _INT8_ATTRS) if isinstance(t, torch.Tensor)]


def _is_int8(p: torch.Tensor) -> bool:
    return type(p).__name__ == "Int8Params" and p.dtype is torch.int8


def logical_numel(p: torch.Tensor) -> int:
    """The weights a parameter stands for: a packed 4-bit one counts its unpacked shape's elements."""
    qs = quant_state_of(p)
    shape = getattr(qs, "shape", None) if qs is not None else None
    if shape is not None:
        try:
            return int(torch.Size(shape).numel())
        except (TypeError, ValueError):
            pass
    return int(p.numel())


def quantization_kind(p: torch.Tensor) -> str | None:
    """``nf4``/``fp4`` for a 4-bit parameter, ``int8`` for an 8-bit one, else None."""
    qs = quant_state_of(p)
    if qs is not None:
        kind = getattr(qs, "quant_type", None)
        return kind if kind in ("nf4", "fp4") else None
    return "int8" if _is_int8(p) else None


def weight_quantization(params: Iterable[torch.Tensor]) -> str | None:
    """The model's weight format: the quantization covering most (logical) parameters, or None."""
    counts: dict[str, int] = {}
    for p in params:
        kind = quantization_kind(p)
        if kind is not None:
            counts[kind] = counts.get(kind, 0) + logical_numel(p)
    return max(counts.items(), key=lambda kv: kv[1])[0] if counts else None
