"""Activations: the storages autograd saves for backward, seen through ``saved_tensors_hooks``.

The counter composes with whatever pack/unpack pair is active when it starts (the user's own hooks,
``torch.autograd.graph.save_on_cpu()``, a library that offloads or compresses saved tensors): torch
calls only the innermost pair, so the counter's pack calls the user's pack and counts what it returns,
and its unpack calls the user's unpack. The user's hooks see exactly the calls they would see without
the counter. A pair that AOTAutograd inlines into compiled graphs (fx GraphModules) is left alone: that
forward is not counted.

Storages are classified once each: parameters and buffers are weights (skipped), autocast's low-precision
copies of parameters are weight copies, parameters that are not the model's (FSDP2 swaps its all-gathered,
unsharded copy in for the forward) are unsharded parameters, storages that existed before the step (the
forward's inputs, and integer views sliced from a larger tensor: token ids or labels cut from a dataset)
are inputs, the rest activations. Nothing is counted while backward runs (a reentrant checkpoint's
recomputation is not what the step holds between forward and backward).

Gradient checkpointing keeps a region's inputs for its recomputation, partly outside saved-tensor hooks:
the positional tensors go through them (``save_inputs``, or the reentrant ``save_for_backward``), but the
keyword arguments — a ``functools.partial`` of the layer with its rotary cos/sin, ``position_ids`` and a
(B, 1, S, S) attention mask, Hugging Face's way — and the CPU RNG state stay in the checkpoint's closure.
When the pack hook sees a checkpoint save its positional inputs, the counter reads the checkpoint's frame
for those tensors and counts them, each storage once, as it counts a saved tensor.
"""

from __future__ import annotations

import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any

import torch

from anatomy.hook.saved_values import (
    graph_roots,
    in_backward,
    is_sliced_integer_view,
    reused_after_reshard,
    tensors_held,
    tensors_in,
)
from anatomy.hook.tensors import storage_key

_PackPair = tuple[Callable[[torch.Tensor], Any], Callable[[Any], torch.Tensor]]
_ACTIVATION, _COPY, _INPUT, _UNSHARDED = 0, 1, 2, 3
# autograd's call into a Python pack hook, which the time taken inside it does not see (measured: ~1 µs)
PACK_CALL_S = 1e-6


class _CheckpointCode:
    """The code objects of torch's checkpoint at which the pack hook is called (looked up once)."""

    def __init__(self) -> None:
        self.saving: frozenset[types.CodeType] = frozenset()  # non-reentrant save_inputs (and its listcomp)
        self.generator: types.CodeType | None = None  # its frame holds fn, args, kwargs, the RNG state
        self.apply: types.CodeType | None = None  # Function.apply: the reentrant CheckpointFunction's
        self.reentrant: Any = None
        try:
            from torch.autograd.function import Function
            from torch.utils import checkpoint as cp

            save = cp._CheckpointFrame.save_inputs.__code__
            nested = [c for c in save.co_consts if isinstance(c, types.CodeType)]  # Python < 3.12's listcomp
            self.saving = frozenset([save, *nested])
            self.generator = cp._checkpoint_without_reentrant_generator.__code__
            self.apply = Function.apply.__func__.__code__  # type: ignore[attr-defined]
            self.reentrant = cp.CheckpointFunction
        except Exception:  # another torch: checkpoints' closures are not counted
            self.saving = frozenset()


_checkpoint_code: _CheckpointCode | None = None


def _checkpoint_inputs(caller: types.FrameType | None) -> tuple[list[Any], bool] | None:
    """What a checkpoint keeps for its recomputation, when ``caller`` (the frame that made the pack hook's
    call) is a checkpoint saving its positional inputs, and whether it is a reentrant one; else None."""
    code = _checkpoint_code
    if caller is None or code is None:
        return None
    if caller.f_code in code.saving:
        frame: types.FrameType | None = caller
        for _ in range(3):  # save_inputs' listcomp -> save_inputs -> the generator
            if frame is None or frame.f_code is code.generator:
                break
            frame = frame.f_back
        if frame is None or frame.f_code is not code.generator:
            return None
        held = frame.f_locals
        return [held.get("fn"), held.get("args"), held.get("kwargs"), held.get("fwd_cpu_state")], False
    if caller.f_code is code.apply and caller.f_locals.get("cls") is code.reentrant:
        # (run_function, preserve_rng_state, *inputs); its RNG state is on its node, read after the forward
        return [caller.f_locals.get("args")], True
    return None


class _Packed:
    """What autograd keeps instead of a user's packed object that cannot be weakly referenced (a tuple),
    on a traced step only: its death tells that backward freed the saved tensor."""

    __slots__ = ("__weakref__", "inner")

    def __init__(self, inner: Any) -> None:
        self.inner = inner


class SavedTensorCounter:
    """Counts the storages autograd saves for backward while started (``start()``/``stop()``, or use as
    a context manager). Each storage counts once, by kind: ``activation_bytes``, ``weight_copy_bytes``,
    ``input_bytes``. ``device``: count only storages on this device (None: all)."""

    def __init__(self, weights: Iterable[torch.Tensor] = ()) -> None:
        self._weight_keys: frozenset[int] = frozenset()
        self._sharded = False
        self.set_params(weights)
        self._input_keys: frozenset[int] = frozenset()
        self.device: torch.device | None = None
        self._kind: dict[int, int] = {}  # storage key -> kind, for every storage seen since reset
        self._bytes = [0, 0, 0, 0]  # by kind
        # the unsharded parameters seen: their storages come and go (FSDP frees them by resizing)
        self._unsharded: dict[int, weakref.ref[torch.Tensor]] = {}
        self.weight_copy_dtype: torch.dtype | None = None
        self.uncounted = 0
        self.counting = False
        self.spent_s = 0.0  # time counting cost the forward (the schedule's budget takes it)
        self.reentrant_seen = (
            False  # a reentrant checkpoint saved its inputs since the last look at its nodes
        )
        self._pushed: _PackPair | None = None  # our pair, while on torch's stack
        self.active = False  # ``_pushed is not None``, as a plain attribute: the tracker asks every step
        self._open = False  # may stay pushed after the forward (no user pair below ours)
        # Off except on the sampled step that traces memory per op (a weak reference per saved tensor).
        self.track_alive = False
        self.alive_activation_bytes = 0
        self.alive_copy_bytes = 0
        self._alive_count: dict[int, int] = {}  # storage key -> its live saved tensors
        self._alive_bytes: dict[int, int] = {}  # storage key -> its bytes (negative: a weight's copy)
        # keyed by id: a set compares weak references by their referents and merges two refs of one tensor
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._ref_keys: dict[int, int] = {}  # id of a weak reference -> the storage key it counts
        self._on_release = self._release  # (one bound method for every reference's callback)
        self._alive_lock = threading.Lock()

    def set_params(self, weights: Iterable[torch.Tensor]) -> None:
        """The weight storages (parameters and buffers): never activations. Sharded parameters (DTensors:
        FSDP2; DeepSpeed ZeRO-3's ``ds_tensor`` partitions) mean that other parameters the forward saves are
        the gathered copies."""
        weights = list(weights)
        self._weight_keys = frozenset(storage_key(p) for p in weights)
        self._sharded = any(
            isinstance(getattr(p, "_local_tensor", None), torch.Tensor)
            or isinstance(getattr(p, "ds_tensor", None), torch.Tensor)
            for p in weights
        )

    def set_inputs(self, keys: frozenset[int]) -> None:
        """Storages of the forward's inputs: they existed before the step."""
        self._input_keys = keys

    @property
    def activation_bytes(self) -> int:
        return self._bytes[_ACTIVATION]

    @property
    def weight_copy_bytes(self) -> int:
        return self._bytes[_COPY]

    @property
    def input_bytes(self) -> int:
        return self._bytes[_INPUT]

    @property
    def unsharded_seen(self) -> bool:
        return bool(self._bytes[_UNSHARDED])

    def unsharded_held_bytes(self, params: Iterable[torch.Tensor] = ()) -> int:
        """Bytes the unsharded parameters seen since the reset hold now (each storage once), and those
        among ``params`` (the model's, read as its modules hold them now) that are gathered: FSDP2
        registers the all-gathered parameter on its module while unsharded, so a parameter that is not a
        shard and not a known weight storage is a gathered copy — also one the forward did not save (an
        embedding's weight: its backward keeps only the indices), which the root keeps into backward."""
        seen: set[int] = set()
        total = 0
        gathered: list[torch.Tensor] = []
        if self._sharded:
            gathered = [
                p
                for p in params
                if not isinstance(getattr(p, "_local_tensor", None), torch.Tensor)
                and storage_key(p) not in self._weight_keys
            ]
        for p in [*(ref() for ref in list(self._unsharded.values())), *gathered]:
            if p is None:
                continue
            storage = p.untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    def reset(self) -> None:
        self._kind = {}
        self._bytes = [0, 0, 0, 0]
        self._unsharded = {}

    # -- torch's side -----------------------------------------------------------------------------

    def _pair(self, user: _PackPair | None) -> _PackPair:
        if user is None:

            def pack(t: torch.Tensor) -> Any:
                if not self.counting:
                    return t
                began = perf_counter()
                out = self._observe(t, t)
                self.spent_s += perf_counter() - began + PACK_CALL_S
                return out

            def unpack(packed: Any) -> torch.Tensor:
                return packed  # type: ignore[no-any-return]

            return pack, unpack
        user_pack, user_unpack = user

        def pack_composed(t: torch.Tensor) -> Any:
            packed = user_pack(t)
            if not self.counting:
                return packed
            began = perf_counter()
            out = self._observe(t, packed)
            self.spent_s += perf_counter() - began + PACK_CALL_S
            return out

        def unpack_composed(packed: Any) -> torch.Tensor:
            return user_unpack(packed.inner if type(packed) is _Packed else packed)

        return pack_composed, unpack_composed

    def _observe(self, t: torch.Tensor, packed: Any) -> Any:
        """Count what ``packed`` (what autograd will keep for ``t``) holds; return what autograd keeps."""
        # Runs inside the user's forward, once per saved tensor: nothing may escape from here, and the
        # common case (the tensor itself, its storage already seen) costs a few attribute reads.
        try:
            if _checkpoint_code is not None and _checkpoint_code.saving:
                found = _checkpoint_inputs(sys._getframe(2))  # 0: here, 1: our pack, 2: who saves
                if found is not None:
                    self._observe_checkpoint(found[0])
                    self.reentrant_seen = self.reentrant_seen or found[1]
            if packed is t:
                storage = t.untyped_storage()
                key = storage.data_ptr() or -id(t)
                if key in self._weight_keys:
                    return packed
                known = self._kind.get(key)
                if known == _UNSHARDED and reused_after_reshard(t):
                    known = None
                if known is None:
                    if in_backward():
                        return packed
                    known = self._first_seen(t, key, storage.nbytes(), self._classify(t, key))
                if self.track_alive and known in (_ACTIVATION, _COPY):
                    return self._watch(packed, key, known, storage.nbytes())
                return packed
            return self._observe_packed(t, packed)
        except Exception:  # sparse/nested tensors have no single storage: not counted
            self.uncounted += 1
            return packed

    def _observe_packed(self, t: torch.Tensor, packed: Any) -> Any:
        """A user's pack returned something else: count the tensors in it that stay on the device."""
        if storage_key(t) in self._weight_keys or in_backward():
            return packed
        kind = self._classify(t, storage_key(t))
        kept = packed
        for p in tensors_in(packed):
            if self.device is not None and p.device != self.device:
                continue  # moved off the device (offloaded): not memory of this device
            storage = p.untyped_storage()
            key = storage.data_ptr() or -id(p)
            known = self._kind.get(key)
            if known == _UNSHARDED and reused_after_reshard(p):
                known = None
            if known is None:
                known = self._first_seen(t, key, storage.nbytes(), kind)
            if self.track_alive and known in (_ACTIVATION, _COPY):
                kept = self._watch(kept, key, known, storage.nbytes())
        return kept

    def _observe_checkpoint(self, held: list[Any]) -> None:
        """Count the tensors a checkpoint keeps in its closure (the pack hook sees only its positional
        inputs), as saved tensors: weights skipped, inputs as inputs, each storage once."""
        if in_backward():
            return
        for t in tensors_held(held):
            if t.layout is not torch.strided or (self.device is not None and t.device != self.device):
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr() or -id(t)
            if key in self._weight_keys or (key in self._kind and not self._stale(t, key)):
                continue
            self._first_seen(t, key, storage.nbytes(), self._classify(t, key))

    def observe_reentrant_states(self, output: Any, limit: int = 100_000) -> None:
        """A reentrant checkpoint keeps the CPU RNG state (and the GPUs') on its autograd node, made after
        the pack hook ran: once the forward returns, find the checkpoints' nodes in its graph (small: a
        reentrant checkpoint's inside runs without autograd) and count what they keep. Only after a forward
        that ran reentrant checkpoints."""
        if not self.reentrant_seen:
            return
        self.reentrant_seen = False
        code = _checkpoint_code
        reentrant = code.reentrant if code is not None else None
        if reentrant is None:
            return
        todo, seen = graph_roots(output), set[int]()
        while todo and len(seen) < limit:
            node = todo.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, reentrant._backward_cls):
                self._observe_checkpoint(
                    [getattr(node, "fwd_cpu_state", None), getattr(node, "fwd_gpu_states", None)]
                )
            todo.extend(fn for fn, _ in node.next_functions)

    def _stale(self, t: torch.Tensor, key: int) -> bool:
        return self._kind.get(key) == _UNSHARDED and reused_after_reshard(t)

    def _first_seen(self, t: torch.Tensor, key: int, nbytes: int, kind: int) -> int:
        self._kind[key] = kind
        self._bytes[kind] += nbytes
        if kind == _COPY:
            self.weight_copy_dtype = t.dtype
        return kind

    def _classify(self, t: torch.Tensor, key: int) -> int:
        if key in self._input_keys or is_sliced_integer_view(t):
            return _INPUT
        base = t._base if t._base is not None else t
        if self._sharded and isinstance(base, torch.nn.Parameter):  # not the model's: FSDP's gathered copy
            self._unsharded[id(base)] = weakref.ref(base)
            return _UNSHARDED
        return _COPY if self._is_weight_copy(t) else _ACTIVATION

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

    # -- what is alive now (traced steps only) ----------------------------------------------------
    # Autograd keeps the packed object until backward frees that saved tensor, so a weak reference to
    # it tells when: per storage, a count of live saved tensors gives the bytes of activations still
    # held at any moment, in O(1) per read.

    def _watch(self, kept: Any, key: int, kind: int, nbytes: int) -> Any:
        # One weak reference a saved tensor and nothing else the collector tracks (a traced step of a deep
        # model saves thousands: a callback bound per reference and a list per storage were three
        # containers each, and gen-2 collections the plain loop never has).
        release = self._on_release
        try:
            ref = weakref.ref(kept, release)
        except TypeError:  # a user's tuple: autograd keeps our wrapper instead, unwrapped in unpack
            kept = _Packed(kept)
            ref = weakref.ref(kept, release)
        with self._alive_lock:
            count = self._alive_count.get(key, 0)
            if count == 0:
                if kind == _COPY:
                    self._alive_bytes[key] = -nbytes
                    self.alive_copy_bytes += nbytes
                else:
                    self._alive_bytes[key] = nbytes
                    self.alive_activation_bytes += nbytes
            self._alive_count[key] = count + 1
            self._ref_keys[id(ref)] = key
            self._refs[id(ref)] = ref
        return kept

    def _release(self, ref: weakref.ref[Any]) -> None:
        # May run on autograd's device thread (CUDA backward): hence the lock.
        with self._alive_lock:
            self._refs.pop(id(ref), None)
            key = self._ref_keys.pop(id(ref), None)
            if key is None:
                return
            count = self._alive_count.get(key, 0) - 1
            if count > 0:
                self._alive_count[key] = count
                return
            self._alive_count.pop(key, None)
            nbytes = self._alive_bytes.pop(key, 0)
            if nbytes < 0:
                self.alive_copy_bytes += nbytes
            else:
                self.alive_activation_bytes -= nbytes

    # -- the window -------------------------------------------------------------------------------

    def start(self, keep_open: bool = False) -> bool:
        """Push a pair composed with the active one and count from here. ``keep_open``: the window may
        outlive the forward that starts it (see ``end_forward``). Returns False (nothing counted) when the
        active pair is one compiled graphs inline, or ours is buried under a pair pushed since."""
        if self._pushed is not None:  # the window of an earlier forward of this step, still open
            if not self._on_top():
                return False  # under a pair pushed since: torch would not call ours
            self.counting = True
            return True
        user = torch._C._autograd._top_saved_tensors_default_hooks(True)
        if user is not None and all(isinstance(h, torch.fx.GraphModule) for h in user):
            return False
        global _checkpoint_code
        if _checkpoint_code is None and "torch.utils.checkpoint" in sys.modules:
            _checkpoint_code = _CheckpointCode()
        pair = self._pair(user)
        torch._C._autograd._push_saved_tensors_default_hooks(*pair)
        self._pushed = pair
        self.active = True
        self._open = keep_open and user is None
        self.counting = True
        return True

    def end_forward(self) -> None:
        """The forward that started the window returns. With no user pair below ours, the window stays
        open until ``stop()`` (the loss computed after the model is saved there too: the step's next
        boundary closes it); otherwise ours leaves now, while it is sure to be on top."""
        if not self._open or not self._on_top():
            self.stop()

    def _on_top(self) -> bool:
        pushed = self._pushed
        top = torch._C._autograd._top_saved_tensors_default_hooks(True)
        return pushed is not None and top is not None and top[0] is pushed[0]

    def stop(self) -> None:
        """Stop counting and take our pair off torch's stack — only while it is on top: a pair the user
        pushed later (still open) stays above ours untouched, and ours leaves at a later ``stop()``."""
        self.counting = False
        if self._pushed is not None and self._on_top():
            torch._C._autograd._pop_saved_tensors_default_hooks()
            self._pushed = None
            self.active = False
            self._open = False

    def __enter__(self) -> SavedTensorCounter:
        self.reset()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
