"""The memory timeline of a fake step: every storage an op creates, when it is freed, and what it is.

A TorchDispatchMode sees every new storage an op returns (an allocation); a weakref on the storage
sees it freed. Replaying those events gives the live bytes after every op. Each storage falls in one
:class:`Category`, decided once the step has run (a storage is "saved" if autograd packed it, a
"gradient" if it ended up as ``param.grad``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from anatomy.plan import values
from anatomy.plan.settings import Target
from anatomy.plan.states import allocation_bytes


class Category(Enum):
    """What a live storage of the step is."""

    PARAMETER = "parameter"  # parameters and buffers
    WEIGHT_COPY = "weight_copy"  # autocast's low-precision copy of a parameter
    GRADIENT = "gradient"  # ends up as a parameter's .grad
    SAVED = "saved"  # packed by autograd for backward: the activations
    TEMPORARY = "temporary"  # everything else (outputs the loop holds, loss buffers, grads in flight)


def zero_categories() -> dict[Category, int]:
    return dict.fromkeys(Category, 0)


class Mark(Enum):
    """Where the fake step is: marks split the timeline into spans."""

    FORWARD = "forward"
    BACKWARD = "backward"
    END = "end"


@dataclass(frozen=True)
class PhasePeak:
    """The most bytes live in one phase, and what they were."""

    bytes: int
    by_category: dict[Category, int]

    @staticmethod
    def empty() -> PhasePeak:
        return PhasePeak(0, zero_categories())


class Timeline(TorchDispatchMode):
    """Every storage an op creates (alloc event) and frees (weakref callback), in order."""

    def __init__(self, target: Target, real_values: bool = False) -> None:
        super().__init__()
        self.target = target
        self.real_values = real_values  # run small batch-derived ops for real (anatomy.plan.values)
        self.live: dict[int, int] = {}  # storage _cdata -> allocation id
        self.sizes: dict[int, int] = {}  # allocation id -> bytes
        self.events: list[int] = []  # +id alloc, -id free
        self.refs: dict[int, weakref.ref] = {}
        self.param_ids: set[int] = set()
        self.copy_ids: set[int] = set()
        self.marks: list[tuple[int, Mark, int]] = []  # (event index, phase, micro-batch)
        self._next = 1

    def register(self, t: torch.Tensor) -> int:
        """The allocation id of ``t``'s storage (registered as a new allocation if unseen)."""
        st = t.untyped_storage()
        key = st._cdata
        aid = self.live.get(key)
        if aid is not None:
            return aid
        aid = self._next
        self._next += 1
        self.live[key] = aid
        self.sizes[aid] = allocation_bytes(st.nbytes(), self.target)
        self.events.append(aid)

        def _freed(_ref: object, key: int = key, aid: int = aid) -> None:
            if self.live.get(key) == aid:
                del self.live[key]
                self.events.append(-aid)
            self.refs.pop(aid, None)

        self.refs[aid] = weakref.ref(st, _freed)
        return aid

    def mark(self, phase: Mark, micro_batch: int) -> None:
        self.marks.append((len(self.events), phase, micro_batch))

    def live_ids(self) -> set[int]:
        return set(self.live.values())

    def bytes_of(self, ids: Iterable[int]) -> int:
        return sum(self.sizes[i] for i in set(ids))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = values.dispatch(func, args, kwargs) if self.real_values else func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                aid = self.register(t)
                if func is torch.ops.aten._to_copy.default and args and isinstance(args[0], torch.Tensor):
                    src = self.live.get(args[0].untyped_storage()._cdata)
                    if src in self.param_ids:
                        self.copy_ids.add(aid)
        return out


def replay(timeline: Timeline, categories: dict[int, Category]) -> dict[tuple[Mark, int], PhasePeak]:
    """The peak of each (phase, micro-batch) span between the timeline's marks."""
    sizes = timeline.sizes
    totals = zero_categories()
    peaks: dict[tuple[Mark, int], PhasePeak] = {}
    mark_at = {index: (phase, mb) for index, phase, mb in timeline.marks}
    span: tuple[Mark, int] = (Mark.FORWARD, 0)
    live_total = 0
    for idx, ev in enumerate(timeline.events):
        if idx in mark_at and mark_at[idx][0] is not Mark.END:
            span = mark_at[idx]
        aid = abs(ev)
        delta = sizes[aid] if ev > 0 else -sizes[aid]
        totals[categories[aid]] += delta
        live_total += delta
        best = peaks.get(span)
        if best is None or live_total > best.bytes:
            peaks[span] = PhasePeak(live_total, totals.copy())
    return peaks
