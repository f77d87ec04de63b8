"""Gradients alive at any moment of a traced step."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Iterable

import torch

from anatomy.hook.tensors import storage_bytes


class GradientWatcher:
    """Bytes of ``.grad`` tensors alive, kept current during one sampled step: a gradient is counted
    when a post-accumulate-grad hook first sees it, and uncounted when its tensor dies (``zero_grad``
    with ``set_to_none``; a weak reference tells). ``close()`` removes the hooks."""

    def __init__(self, params: Iterable[torch.Tensor]) -> None:
        params = [p for p in params if isinstance(p, torch.Tensor)]
        self.bytes = 0
        self._watched: set[int] = set()  # id() of the gradient tensors counted and alive
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}
        self._lock = threading.Lock()  # callbacks may run on autograd's device threads
        for p in params:
            if p.grad is not None:
                self._watch(p.grad)
        hook = self._on_grad
        self._handles = [p.register_post_accumulate_grad_hook(hook) for p in params if p.requires_grad]

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

    def _on_grad(self, p: torch.Tensor) -> None:
        try:
            if p.grad is not None:
                self._watch(p.grad)
        except Exception:  # inside the user's backward: never in the way
            pass

    def close(self) -> None:
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()
        with self._lock:
            self._refs.clear()  # the references die with their callbacks: nothing fires after this
