"""Gradients alive at any moment of a traced step."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge

from anatomy.hook.tensors import storage_bytes


class GradientWatcher:
    """Bytes of ``.grad`` tensors alive, kept current during one sampled step: a gradient is counted
    when its parameter's gradient accumulator has run (a post-hook on autograd's ``AccumulateGrad`` node),
    and uncounted when its tensor dies (``zero_grad`` with ``set_to_none``; a weak reference tells).
    ``close()`` removes the hooks and lets the nodes go.

    Not ``Tensor.register_post_accumulate_grad_hook``: the hook it installs on the tensor stays in C++
    after its handle is removed, and every later backward takes the GIL per parameter to run an empty
    dict — measured at +37 µs a step on 32 parameters, for the rest of the run after one traced step.
    A node's hooks go with the node: the watch holds the accumulators while it lives (the forward's graph
    then uses them, as DDP's reducer does), and once it drops them the next graph makes fresh ones."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        params = [p for p in params if isinstance(p, torch.Tensor)]
        self.bytes = 0
        self._watched: set[int] = set()  # id() of the gradient tensors counted and alive
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}
        self._lock = threading.Lock()  # callbacks may run on autograd's device threads
        for p in params:
            if p.grad is not None:
                self._watch(p.grad)
        self._handles: list[Any] = []
        self._nodes: list[Any] = []  # the accumulators, held: a hook lives as long as its node
        for p in params:
            if not p.requires_grad or p.grad_fn is not None:
                continue  # (not a leaf: no gradient of its own is accumulated)
            try:
                node = get_gradient_edge(p).node
            except Exception:  # (a tensor type autograd gives no accumulator here: its gradient unseen)
                continue
            self._nodes.append(node)
            self._handles.append(node.register_hook(functools.partial(self._on_accumulated, p)))

    def _watch(self, g: torch.Tensor) -> None:
        gid = id(g)
        with self._lock:
            if gid in self._watched:
                return
            nbytes = storage_bytes(g)
            self._watched.add(gid)
            self.bytes += nbytes
        ref = weakref.ref(g, functools.partial(self._release, gid, nbytes))
        self._refs[id(ref)] = ref

    def _release(self, gid: int, nbytes: int, ref: weakref.ref[torch.Tensor]) -> None:
        with self._lock:
            if self._refs.pop(id(ref), None) is None:
                return  # closed meanwhile
            self._watched.discard(gid)
            self.bytes -= nbytes

    def _on_accumulated(self, p: torch.Tensor, grad_inputs: Any, grad_outputs: Any) -> None:
        try:
            if p.grad is not None:
                self._watch(p.grad)
        except Exception:  # inside the user's backward: never in the way
            pass

    def close(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()
        self._nodes = []
        with self._lock:
            self._refs.clear()  # the references die with their callbacks: nothing fires after this
