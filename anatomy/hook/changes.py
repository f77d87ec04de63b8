"""Noticing, cheaply, that the model or the optimizer changed mid-run.

A model's parameters change by assignment (an untied or resized head, a new embedding module: torch's
parameter and module registration hooks fire, and the watch only notes whether the module is one of the
model's), by ``.to()`` (new storages: the tracker compares one parameter's data pointer every step), or in
ways no hook sees (``p.data = ...``, ``requires_grad_()``: the signature is compared at most once per publish
interval, within the schedule's time budget — never a walk on every step). An optimizer re-created without
telling the tracker is found at its first step (a step pre-hook for every optimizer: an identity check, and a
one-time look at its parameters; the same hook begins the tracked optimizers' steps). Nothing here holds a
reference that keeps a user's object alive.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.nn.modules import module as torch_module
from torch.nn.modules.module import (
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)
from torch.optim import optimizer as torch_optimizer
from torch.optim.optimizer import register_optimizer_step_pre_hook

from anatomy.hook.tensors import storage_key, unwrap_optimizer

Signature = tuple[tuple[int, int, tuple[int, ...], torch.dtype, bool], ...]


def model_signature(params: Iterable[torch.Tensor]) -> Signature:
    """Of a model's parameters (``model.parameters()``)."""
    return tuple((id(p), storage_key(p), tuple(p.shape), p.dtype, p.requires_grad) for p in params)


def same_signature(model: torch.nn.Module, signature: Signature) -> bool:
    """``model_signature(model.parameters()) == signature``, compared parameter by parameter: no new
    signature is built (a tuple per parameter all alive at once would be garbage enough to trigger
    collections)."""
    n = len(signature)
    i = 0
    for p in model.parameters():
        if i >= n or signature[i] != (id(p), storage_key(p), tuple(p.shape), p.dtype, p.requires_grad):
            return False
        i += 1
    return i == n


class ModelWatch:
    """Torch's global registration hooks, noting a parameter or module registered on one of the model's
    modules. The module hook rests while the model's forward runs (``pause``/``resume``, or the tracker's
    inline copy of them: one dict operation each): Hugging Face models slice their layer list into a new
    ``ModuleList`` in every forward, one registration per layer — a call of ours per layer per step if it
    did not. A module assigned on the model inside its forward is then found by the periodic look."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._module_ids: frozenset[int] = frozenset()
        self.signature: Signature = ()
        self.suspect = False
        self.closed = False
        self.on_suspect: Callable[[], None] | None = None  # told when ``suspect`` is set
        module_handle = register_module_module_registration_hook(self._registered)
        self._handles = [register_module_parameter_registration_hook(self._registered), module_handle]
        # Where torch keeps the module registration hooks, our key and hook in it (None: not where this
        # torch keeps them, and the hook never rests).
        regs = getattr(torch_module, "_global_module_registration_hooks", None)
        self.key: int = module_handle.id
        self.hook: Any = regs.get(self.key) if isinstance(regs, dict) else None
        self.registrations: dict[int, Any] | None = regs if self.hook is not None else None
        self.remember(model.modules(), model.parameters())

    def pause(self) -> None:
        if self.registrations is not None:
            self.registrations.pop(self.key, None)

    def resume(self) -> None:
        if self.registrations is not None and not self.closed:
            self.registrations[self.key] = self.hook

    def _registered(self, module: torch.nn.Module, name: str, value: Any) -> None:
        if id(module) in self._module_ids:
            self.suspect = True  # returning None: the registration goes on unchanged
            if self.on_suspect is not None:
                self.on_suspect()

    def remember(self, modules: Iterable[torch.nn.Module], params: Iterable[torch.Tensor]) -> None:
        """The model as it is now: its ``modules()`` and ``parameters()``."""
        self._module_ids = frozenset(id(m) for m in modules)
        self.signature = model_signature(params)
        self.suspect = False

    def changed(self, model: torch.nn.Module, look: bool) -> bool:
        """Did the model's parameters change? Walks them only after a registration on one of the
        model's modules, or when ``look`` (once per publish interval)."""
        if not (self.suspect or look):
            return False
        self.suspect = False
        return not same_signature(model, self.signature)

    def close(self) -> None:
        self.closed = True
        for h in self._handles:
            h.remove()
        self._handles = []


class OptimizerWatch:
    """Finds an optimizer over the model's parameters that steps but is not the tracked one. Its hook is
    torch's global step pre-hook, called at every optimizer step: one call of ours, guarded in itself
    (``fail``), wrapped to run outside compiled frames only once anything is compiled (``keep_out``).

    It is also the tracked optimizers' own step pre-hook (:meth:`step_through`): torch calls the global
    pre-hooks where it calls an optimizer's, just before them, so one hook of ours per optimizer step
    rather than two (after a big step each call of the hook's costs microseconds, cold in the caches)."""

    def __init__(self, adopt: Callable[[Any], None], fail: Callable[[Exception], None]) -> None:
        self.current: weakref.ref[Any] | None = None
        self.extra: weakref.WeakSet[Any] = weakref.WeakSet()  # further tracked optimizers (a GAN's)
        self._param_ids: frozenset[int] = frozenset()
        self._others: weakref.WeakSet[Any] = weakref.WeakSet()  # optimizers over other parameters
        self._adopt = adopt
        self._fail = fail
        # The optimizers whose step pre-hook this is: the first one, the rest; and what their step calls.
        self._first: weakref.ref[Any] | None = None
        self._rest: weakref.WeakSet[Any] = weakref.WeakSet()
        self._on_step: Callable[[Any, Any, Any], Any] | None = None
        self._handle = register_optimizer_step_pre_hook(self._stepping)
        self._paused: Any = None  # the hook taken out of torch's dict while steps rest (pause/resume)

    def pause(self) -> None:
        """Out of torch's global step pre-hooks while steps rest (an optimizer that steps meanwhile is
        found at the next step that looks)."""
        hooks = torch_optimizer._global_optimizer_pre_hooks
        hook = hooks.pop(self._handle.id, None)
        if hook is not None:
            self._paused = hook

    def resume(self) -> None:
        hook, self._paused = self._paused, None
        if hook is not None:
            torch_optimizer._global_optimizer_pre_hooks[self._handle.id] = hook

    def step_through(self, optimizers: list[Any], on_step: Callable[[Any, Any, Any], Any] | None) -> None:
        """Call ``on_step`` (a step pre-hook: what it returns, torch takes) where one of ``optimizers``
        steps; none: no optimizer's."""
        self._first = weakref.ref(optimizers[0]) if optimizers else None
        self._rest = weakref.WeakSet(optimizers[1:])
        self._on_step = on_step

    def keep_out(self, wrap: Callable[[Any], Any]) -> None:
        """Register the hook again, wrapped (``outside_compile``)."""
        self._paused = None
        self._handle.remove()
        self._handle = register_optimizer_step_pre_hook(wrap(self._stepping))

    def set_params(self, params: Iterable[torch.Tensor]) -> None:
        """The tracked model's parameters (an optimizer over none of them is another model's)."""
        self._param_ids = frozenset(id(p) for p in params)
        self._others = weakref.WeakSet()

    def _stepping(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        first = self._first
        if first is not None and first() is optimizer:  # (the tracked optimizer: its own pre-hook)
            return self._on_step(optimizer, args, kwargs)  # type: ignore[misc]
        try:
            if optimizer in self._rest:
                return self._on_step(optimizer, args, kwargs)  # type: ignore[misc]
            current = self.current() if self.current is not None else None
            if optimizer is current or optimizer in self._others:
                return None
            opt = unwrap_optimizer(optimizer)
            if opt is current or opt in self.extra:
                return None
            groups = getattr(opt, "param_groups", ())
            if any(id(p) in self._param_ids for g in groups for p in g.get("params", ())):
                self._adopt(opt)
                if opt is optimizer and self._first is not None and self._first() is optimizer:
                    return self._on_step(optimizer, args, kwargs)  # type: ignore[misc]  # (adopted: this step)
            else:
                self._others.add(optimizer)
        except Exception as exc:  # never into the optimizer's step
            self._fail(exc)
        return None

    def close(self) -> None:
        self._paused = None
        self._handle.remove()
