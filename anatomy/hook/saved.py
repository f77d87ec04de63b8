"""Activations: the storages autograd saves for backward, seen through ``saved_tensors_hooks``."""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from anatomy.hook.tensors import storage_key


class SavedTensorCounter:
    """Counts the storages autograd saves for backward while active (push with ``start()``, pop
    with ``stop()``, or use as a context manager).

    Each storage counts once. Parameter storages (and views of them: a third of what is packed)
    are skipped; autocast's low-precision copies of parameters are counted apart, in
    ``weight_copy_bytes``, because they are weights-related memory, not activations. The packed
    tensor itself is returned, so saving costs nothing beyond a few attribute reads.
    """

    def __init__(self, params: Iterable[torch.Tensor] = ()) -> None:
        self._param_keys: frozenset[int] = frozenset()
        self.set_params(params)
        self._seen: dict[int, int] = {}
        self._copies: dict[int, int] = {}
        self.weight_copy_dtype: torch.dtype | None = None
        self.uncounted = 0
        self._ctx: contextlib.AbstractContextManager[Any] | None = None
        # Off except on the sampled step that traces memory per op (a weak reference per saved tensor).
        self.track_alive = False
        self.alive_activation_bytes = 0
        self.alive_copy_bytes = 0
        self._alive: dict[int, list[int]] = {}  # storage key -> [live saved tensors, bytes, is a copy]
        # keyed by id: a set compares weak references by their referents and merges two refs of one tensor
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}
        self._alive_lock = threading.Lock()

    def set_params(self, params: Iterable[torch.Tensor]) -> None:
        self._param_keys = frozenset(storage_key(p) for p in params)

    @property
    def active(self) -> bool:
        return self._ctx is not None

    @property
    def activation_bytes(self) -> int:
        return sum(self._seen.values())

    @property
    def weight_copy_bytes(self) -> int:
        return sum(self._copies.values())

    def reset(self) -> None:
        self._seen = {}
        self._copies = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        # Runs inside the user's forward: nothing may escape from here.
        try:
            self._count(t)
        except Exception:  # sparse/nested tensors have no single storage: not counted
            self.uncounted += 1
        return t

    def _count(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr() or -id(t)
        if key in self._param_keys:
            return
        if key in self._seen:
            copy = False
        elif key in self._copies:
            copy = True
        else:
            copy = self._is_weight_copy(t)
            if copy:
                self._copies[key] = storage.nbytes()
                self.weight_copy_dtype = t.dtype
            else:
                self._seen[key] = storage.nbytes()
        if self.track_alive:
            self._watch(t, key, copy)

    @staticmethod
    def _is_weight_copy(t: torch.Tensor) -> bool:
        # autocast's cast of a parameter: a tensor (or a view of one: ``_base`` is the root) made by
        # ToCopyBackward0 straight from the parameter's AccumulateGrad. Only ToCopy outputs are
        # looked at further, so the common case costs two attribute reads.
        base = t._base if t._base is not None else t
        fn = base.grad_fn
        if fn is not None and type(fn).__name__ == "ToCopyBackward0":
            parents = fn.next_functions
            src = parents[0][0] if parents else None
            return src is not None and type(src).__name__ == "AccumulateGrad"
        return False

    # -- what is alive now (sampled steps only) ---------------------------------------------------
    # The packed object autograd keeps is the tensor itself, so a weak reference to it dies when
    # backward frees that saved tensor: per storage, a count of live saved tensors gives the bytes
    # of activations still held at any moment, in O(1) per read.

    def _watch(self, t: torch.Tensor, key: int, copy: bool) -> None:
        with self._alive_lock:
            entry = self._alive.get(key)
            if entry is None:
                nbytes = self._copies[key] if copy else self._seen[key]
                entry = self._alive[key] = [0, nbytes, int(copy)]
                if copy:
                    self.alive_copy_bytes += nbytes
                else:
                    self.alive_activation_bytes += nbytes
            entry[0] += 1
        ref = weakref.ref(t, functools.partial(self._release, key))
        self._refs[id(ref)] = ref

    def _release(self, key: int, ref: weakref.ref[torch.Tensor]) -> None:
        # May run on autograd's device thread (CUDA backward): hence the lock.
        with self._alive_lock:
            self._refs.pop(id(ref), None)
            entry = self._alive.get(key)
            if entry is None:
                return
            entry[0] -= 1
            if entry[0] <= 0:
                del self._alive[key]
                if entry[2]:
                    self.alive_copy_bytes -= entry[1]
                else:
                    self.alive_activation_bytes -= entry[1]

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def start(self) -> None:
        if self._ctx is not None:
            return
        ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        ctx.__enter__()
        self._ctx = ctx

    def stop(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def __enter__(self) -> SavedTensorCounter:
        self.reset()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
