"""What the activation counter asks of values, tensors and the autograd graph: the tensors in a checkpoint's
arguments or a pack hook's result, a forward's graph roots and input storages, whether backward is running,
and the two storage tests (token ids sliced from a dataset tensor, an FSDP address reused after reshard)."""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from anatomy.hook.tensors import storage_key


def tensors_held(values: Iterable[Any], depth: int = 0) -> Iterable[torch.Tensor]:
    """Tensors in a checkpoint's arguments: in lists, tuples, dicts, a ``functools.partial``'s arguments
    and keywords, a function's closure cells (four levels; modules are not entered: their parameters are
    weights)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif depth >= 4 or value is None or isinstance(value, torch.nn.Module):
            continue
        elif isinstance(value, (list, tuple)):
            yield from tensors_held(value, depth + 1)
        elif isinstance(value, dict):
            yield from tensors_held(value.values(), depth + 1)
        elif isinstance(value, functools.partial):
            yield from tensors_held((value.func, value.args, value.keywords), depth + 1)
        elif isinstance(value, types.FunctionType) and value.__closure__:
            cells = []
            for cell in value.__closure__:
                try:
                    cells.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    continue
            yield from tensors_held(cells, depth + 1)




def graph_roots(output: Any) -> list[Any]:
    """The autograd nodes of a forward's output tensors (a tensor, a tuple/list, a dict or ModelOutput)."""
    values = output.values() if isinstance(output, Mapping) else output
    if isinstance(output, torch.Tensor) or not isinstance(values, Iterable):
        values = [output]
    return [v.grad_fn for v in values if isinstance(v, torch.Tensor) and v.grad_fn is not None]


def in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def tensors_in(packed: Any) -> Iterable[torch.Tensor]:
    """The tensors a pack hook returned: the tensor itself, or those in a tuple/list (``save_on_cpu``
    returns ``(device, tensor)``). Anything else (a handle to disk, a compressed blob) holds no tensor
    memory the tracker can name."""
    if isinstance(packed, torch.Tensor):
        return (packed,)
    if isinstance(packed, (tuple, list)):
        return [x for x in packed if isinstance(x, torch.Tensor)]
    return ()


def input_storage_keys(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> frozenset[int]:
    """Storages of the tensors a forward was called with (one level into lists, tuples and dicts)."""
    keys: set[int] = set()
    for value in (*args, *kwargs.values()):
        if isinstance(value, Mapping):
            items: Iterable[Any] = value.values()
        elif isinstance(value, (list, tuple)):
            items = value
        else:
            items = (value,)
        for item in items:
            if isinstance(item, torch.Tensor) and item.layout is torch.strided:
                keys.add(storage_key(item))
    return frozenset(keys)


def is_sliced_integer_view(t: torch.Tensor) -> bool:
    """Token ids or labels cut from a larger tensor that existed before the step (``tokens[i:i+n]``):
    an integer view with no autograd history whose storage is at least twice what it spans."""
    if t._base is None or t.requires_grad or t.is_floating_point() or t.is_complex() or t.dtype is torch.bool:
        return False
    return t.untyped_storage().nbytes() >= 2 * t.numel() * t.element_size()


def reused_after_reshard(t: torch.Tensor) -> bool:
    """A storage first seen as an all-gathered parameter, now holding a tensor that is not one: FSDP freed
    the gathered parameter after its layer's forward (reshard) and the allocator gave its address to a
    later activation, which must be counted, not taken for the parameter."""
    base = t._base if t._base is not None else t
    return not isinstance(base, torch.nn.Parameter)
