"""Staying out of torch.compile's way.

- The hook's module and optimizer hooks run inside a compiled frame when the model is compiled with
  ``model.compile()`` (or wraps a compiled module): Dynamo would trace them, break the graph on them and
  compile our own code. Wrapped with ``torch._dynamo.disable`` they run eagerly, outside the graph, and
  the model's graph stays whole. The wrapper costs ~0.5 µs a call, so the hooks are wrapped once
  anything is compiled (the model, or any frame in the process): at track(), or re-registered at the
  next step boundary when compilation starts later.
- The per-op dispatch modes of a sampled step declare ``ignore_compile_internals``: with any other
  dispatch mode on the stack Dynamo skips the frame, and torch then runs that code eagerly for good.
- No process-global module hook is ever installed (torch warns about them, and they fire an extra time
  for compiled modules).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])


def dynamo_loaded() -> bool:
    return "torch._dynamo" in sys.modules


def outside_compile(fn: F) -> F:
    """``fn`` made to run eagerly when called from a compiled frame (as is when Dynamo is not loaded)."""
    if not dynamo_loaded():
        return fn
    return torch._dynamo.disable(fn)  # type: ignore[no-any-return]


class CompileProbe:
    """``compile_in_use(model)`` for a model known not to be an ``OptimizedModule``, cheap enough to ask at
    every step boundary: Dynamo's frame counters and the model's ``__dict__`` looked up once. The
    tracker's per-step path reads ``counters`` and ``model_dict`` itself (no call): compiled when
    ``counters["frames"]["ok"]`` or ``model_dict["_compiled_call_impl"]`` is set."""

    __slots__ = ("counters", "model_dict")

    def __init__(self, model: torch.nn.Module) -> None:
        self.model_dict = model.__dict__  # where ``model.compile()`` puts its ``_compiled_call_impl``
        self.counters: Any = None  # Dynamo's counters once it is loaded (cleared by a reset, never replaced)

    def __call__(self) -> bool:
        counters = self.counters
        if counters is None:
            dynamo = sys.modules.get("torch._dynamo")
            if dynamo is None:
                return False
            counters = self.counters = dynamo.utils.counters
        if self.model_dict.get("_compiled_call_impl") is not None:
            return True
        frames = counters.get("frames")  # (.get: a missing key is not created)
        return bool(frames is not None and frames.get("ok"))


def compile_in_use(model: torch.nn.Module) -> bool:
    """The model, one of its modules, or anything in the process was compiled."""
    if not dynamo_loaded():
        return False
    if type(model).__name__ == "OptimizedModule" or getattr(model, "_compiled_call_impl", None) is not None:
        return True
    counters = sys.modules["torch._dynamo"].utils.counters
    return bool(counters["frames"].get("ok"))  # (asked every step: .get, not Counter's __missing__)
