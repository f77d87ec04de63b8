"""What a training loop holds while a step runs: the ``with tracker.step():`` context, and the optimizer
step's closure wrapped to mark its start and return.

Small objects with slots that talk to the tracker only through its public step methods
(:class:`StepOwner`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, Literal, Protocol, TypeVar

import torch


class StepOwner(Protocol):
    """The tracker, as these objects see it."""

    def begin_step(self, samples: int | None = None, tokens: int | None = None) -> None: ...
    def end_step(self, exc: BaseException | None = None) -> None: ...
    def closure_begin(self) -> None: ...
    def closure_end(self) -> None: ...


Owner = TypeVar("Owner", bound=StepOwner)


class StepContext(Generic[Owner]):
    """``with tracker.step(samples=..., tokens=...):`` — one per tracker, reused step after step (its
    values are read as it is entered); a step inside a step gets its own."""

    __slots__ = ("_owner", "entered", "samples", "tokens")

    def __init__(self, owner: Owner, samples: int | None, tokens: int | None) -> None:
        self._owner = owner
        self.samples = samples
        self.tokens = tokens
        self.entered = False

    def __enter__(self) -> Owner:
        self.entered = True
        self._owner.begin_step(self.samples, self.tokens)
        return self._owner

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        self.entered = False
        self._owner.end_step(exc)
        return False  # the user's exception, if any, propagates unchanged


class NullContext(Generic[Owner]):
    """What a disabled or closed tracker's ``step()`` returns: nothing happens."""

    __slots__ = ("_owner",)

    def __init__(self, owner: Owner) -> None:
        self._owner = owner

    def __enter__(self) -> Owner:
        return self._owner

    def __exit__(self, *exc: object) -> Literal[False]:
        return False


def wrap_closure(owner: StepOwner, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
    """``(args, kwargs)`` with the optimizer step's closure wrapped to tell ``owner`` when it starts
    and returns; None when the step has no closure."""
    if "closure" in kwargs:
        closure = kwargs["closure"]
        if not callable(closure):
            return None
        return args, {**kwargs, "closure": TrackedClosure(owner, closure)}
    # torch passes the hooks the step's positional arguments with the optimizer first
    if len(args) > 1 and callable(args[1]) and not isinstance(args[0], torch.Tensor):
        return (args[0], TrackedClosure(owner, args[1]), *args[2:]), kwargs
    return None


class TrackedClosure:
    """Calls the user's closure exactly as the optimizer would; marks its start and its return."""

    __slots__ = ("_closure", "_owner")

    def __init__(self, owner: StepOwner, closure: Callable[..., Any]) -> None:
        self._owner = weakref.ref(owner)
        self._closure = closure

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self._owner()
        if owner is not None:
            owner.closure_begin()  # (never raises: guarded inside)
        result = self._closure(*args, **kwargs)
        if owner is not None:
            owner.closure_end()
        return result
