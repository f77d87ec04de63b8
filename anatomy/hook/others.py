"""Other models in the step: a distillation teacher, a DPO reference model, an EMA copy.

They are not trained (no gradients, no optimizer states) but their parameters and buffers hold memory
through every step; without a name they would land in the runtime baseline (built before the first
step) or in unattributed (built later). Held through weak references, as the trained model is: a model
the user drops is freed, and leaves the anatomy at the next re-sum.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator

import torch

from anatomy.hook.tensors import model_tensors, storage_bytes, storage_key

MAX_NAME = 128


class OtherModels:
    """Named modules whose weights are a component of their own (``other_models``)."""

    def __init__(self) -> None:
        self._refs: dict[str, weakref.ref[torch.nn.Module]] = {}

    def add(self, name: str, module: torch.nn.Module) -> bool:
        """Register (or replace) ``name``; False when it is already this module."""
        name = str(name)[:MAX_NAME] or "model"
        ref = self._refs.get(name)
        if ref is not None and ref() is module:
            return False
        self._refs[name] = weakref.ref(module)
        return True

    def holds(self, module: object) -> bool:
        return any(ref() is module for ref in self._refs.values())

    def __bool__(self) -> bool:
        return bool(self._refs)

    def alive(self) -> Iterator[tuple[str, torch.nn.Module]]:
        for name, ref in list(self._refs.items()):
            module = ref()
            if module is None:
                del self._refs[name]  # dropped by the user: no longer in the step
            else:
                yield name, module

    def tensors(self) -> list[torch.Tensor]:
        return [t for _, m in self.alive() for t in model_tensors(m)]

    def bytes_by_name(self, exclude: Iterable[int], device: torch.device | None) -> dict[str, int]:
        """Bytes of each model's parameters, buffers and quantization states on ``device`` (None: any),
        each storage once across all of them, storages in ``exclude`` (the trained model's) not at all:
        a teacher sharing the student's embedding counts only what it adds."""
        seen = set(exclude)
        out: dict[str, int] = {}
        for name, module in self.alive():
            total = 0
            for t in model_tensors(module):
                if device is not None and not _on(t, device):
                    continue
                key = storage_key(t)
                if key in seen:
                    continue
                seen.add(key)
                total += storage_bytes(t)
            out[name] = total
        return out


def _on(t: torch.Tensor, device: torch.device) -> bool:
    # A model kept on the host while training on a GPU holds none of the GPU's memory.
    if t.device.type != device.type:
        return False
    return device.index is None or t.device.index is None or t.device.index == device.index
