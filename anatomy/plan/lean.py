"""Import only what the fake step needs: transformers' optional integrations off, torch's compiler deferred.

Building a model from its config imports ``transformers.modeling_utils`` and the model's module, which
import far more than a plan runs (``benchmarks/bench_plan.py --walls``; ``python -X importtime``):

* accelerate (and, through transformers' DeepSpeed integration, accelerate's DeepSpeed utilities), for
  loading checkpoints across devices and training under DeepSpeed;
* ``torch.distributed.tensor`` (DTensor, whose import pulls sympy), for tensor-parallel sharding;
* ``torch._dynamo`` — the whole compiler frontend (and ``torch._inductor`` through it) — only because
  transformers decorates functions with ``torch.compiler.disable``, ``torch._dynamo.allow_in_graph`` or
  ``assume_constant_result`` at import and imports a helper (``TransformGetItemToIndex``) from one of its
  submodules.

A plan builds the model on the meta device and on fake tensors and runs it eagerly; its ZeRO/FSDP figures
are its own arithmetic (:mod:`anatomy.plan.sharding`). transformers works without accelerate, DeepSpeed
and torch.distributed (all optional), and decides through ``is_*_available``, which its modules bind when
they are imported: answering False before the first modeling import makes the process plan as on a
machine without them. For ``torch._dynamo`` the package is registered unexecuted (its submodules still
import from its directory, as FakeTensorMode's ``torch._dynamo.config`` does) with eager-identical
stand-ins for the three decorators: outside a compiled region each only marks or wraps the function for
the compiler, which a plan never runs. Any other use of ``torch._dynamo`` executes the real package
first, so nothing can behave otherwise than without this module; it only costs the import then.

Only the ``anatomy-top plan`` process does this (never a library user's process, where the answers would
change what their training does), before it imports any model code; a plan that needs accelerate (a
quantized base model) must not call it. ``ANATOMY_PLAN_LEAN=0`` turns it off.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable
from typing import Any

_OFF = ("is_accelerate_available", "is_deepspeed_available", "is_torch_distributed_available")
_DYNAMO = "torch._dynamo"


def _disable(fn: Callable[..., Any] | None = None, recursive: bool = True, **kwargs: Any) -> Any:
    """``torch._dynamo.disable``: outside torch.compile, calling the function is calling it unwrapped."""
    return fn if fn is not None else _identity


def _identity(fn: Any) -> Any:
    return fn


def _assume_constant_result(fn: Any) -> Any:
    fn._dynamo_marked_constant = True  # what torch's own does (a mark read only by the compiler)
    return fn


# The submodules a plan imports (transformers' masking helper; FakeTensorMode's config and, for a real
# tensor turned fake, ``source``) and everything they import: loadable without the package's __init__.
_STANDALONE = frozenset(
    f"{_DYNAMO}.{name}" for name in ("_trace_wrapped_higher_order_op", "config", "source")
)


class _DeferredDynamo(types.ModuleType):
    """``torch._dynamo`` registered but not executed. The submodules a plan needs load from its directory
    (:class:`_Finder`); any other name not set here executes the real package into this module
    (:func:`_real_dynamo`) and is taken from it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        loaded = sys.modules.get(f"{_DYNAMO}.{name}")
        if loaded is not None:
            return loaded
        if _asked_by_import_system() and self._is_submodule(name):
            raise AttributeError(name)  # ``from torch._dynamo import x``: the import system (and _Finder)
        return getattr(_real_dynamo(), name)

    def _is_submodule(self, name: str) -> bool:
        root = self.__path__[0]
        return os.path.exists(os.path.join(root, name + ".py")) or os.path.isdir(os.path.join(root, name))


def _asked_by_import_system() -> bool:
    caller = sys._getframe(2)  # 0: this function, 1: __getattr__, 2: who looked the name up
    return caller.f_code.co_filename.startswith("<frozen importlib")


class _Finder(importlib.abc.MetaPathFinder):
    """While ``torch._dynamo`` is deferred: a ``_STANDALONE`` submodule (and what it imports) loads on its
    own; importing any other submodule first executes the real package, whose __init__ imports them in
    the order their circular imports need (loading one on its own may not follow it)."""

    def __init__(self) -> None:
        self.inside = 0  # > 0 while a standalone submodule executes: its imports are its own

    def find_spec(
        self, name: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not name.startswith(_DYNAMO + ".") or not isinstance(sys.modules.get(_DYNAMO), _DeferredDynamo):
            return None
        if self.inside or name not in _STANDALONE:
            if not self.inside:
                _real_dynamo()
            return None  # the path finders load it (under the real package if it was just executed)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Counted(spec.loader, self)
        return spec


class _Counted(importlib.abc.Loader):
    def __init__(self, loader: Any, finder: _Finder) -> None:
        self.loader, self.finder = loader, finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        self.finder.inside += 1
        try:
            self.loader.exec_module(module)
        finally:
            self.finder.inside -= 1


def _real_dynamo() -> types.ModuleType:
    """Execute torch/_dynamo/__init__.py into the deferred module itself: whoever holds it (``torch._dynamo``,
    a ``from torch import _dynamo``) then holds the real package, with the submodules already loaded as
    its attributes; its own names replace the stand-ins."""
    import torch

    module = sys.modules[_DYNAMO]
    if isinstance(module, _DeferredDynamo):
        spec = importlib.machinery.PathFinder.find_spec(_DYNAMO, list(torch.__path__))
        assert spec is not None and spec.loader is not None
        module.__class__ = types.ModuleType  # type: ignore[assignment]  # a plain module: _Finder steps aside
        module.__spec__, module.__file__, module.__loader__ = spec, spec.origin, spec.loader
        spec.loader.exec_module(module)
    return module


def _defer_dynamo() -> bool:
    import torch

    if _DYNAMO in sys.modules:
        return False
    stub = _DeferredDynamo(_DYNAMO)
    stub.__path__ = [os.path.join(os.path.dirname(torch.__file__), "_dynamo")]
    stub.__package__ = _DYNAMO
    stub.disable = _disable  # type: ignore[attr-defined]
    stub.allow_in_graph = _identity  # type: ignore[attr-defined]
    stub.assume_constant_result = _assume_constant_result  # type: ignore[attr-defined]
    sys.meta_path.insert(0, _Finder())
    sys.modules[_DYNAMO] = stub
    torch._dynamo = stub  # type: ignore[attr-defined]  # as the import system sets a loaded submodule
    return True


def dynamo_deferred() -> bool:
    """Whether ``torch._dynamo`` is registered but not executed (:func:`lean_imports` deferred it and
    nothing has used more of it than the stand-ins yet)."""
    return isinstance(sys.modules.get(_DYNAMO), _DeferredDynamo)


def lean_imports() -> bool:
    """Answer "not installed" for accelerate, DeepSpeed and torch.distributed to transformers and defer
    ``torch._dynamo``; False if it is too late (model code already imported) or turned off."""
    if os.environ.get("ANATOMY_PLAN_LEAN", "1") == "0" or "transformers.modeling_utils" in sys.modules:
        return False
    import transformers.utils as tu
    import transformers.utils.import_utils as iu

    def unavailable(*args: object, **kwargs: object) -> bool:
        return False

    for name in _OFF:
        for module in (tu, iu):
            if hasattr(module, name):
                setattr(module, name, unavailable)
    _defer_dynamo()
    return True


__all__ = ["dynamo_deferred", "lean_imports"]
