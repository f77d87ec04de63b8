"""The one place where a failing measurement becomes "unmeasured".

Every part of the hook that can fail is a :class:`Feature`. Code that measures runs inside
``with guard(Feature.X):``; an exception raised there is logged once per feature, remembered for the
snapshot's ``error`` field, and turns that feature off: from then on its figures are None (unmeasured),
never a guess, and the training loop never sees the exception. Only ``Exception`` is caught:
``KeyboardInterrupt``/``SystemExit`` pass through as they would without the hook.

The hook's per-step path, where every call counts, writes the same contract out by hand: ``try:`` …
``except Exception as exc: guard.fail(Feature.X, exc)`` around a hook's whole bookkeeping, and
``Feature.X not in guard.off`` for ``guard.ok(Feature.X)``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum
from typing import Any

log = logging.getLogger("anatomy")

MAX_TEXT = 4000  # protocol strings are capped at 4096


class Feature(str, Enum):
    """What can fail on its own, named as the snapshot's ``error`` text names it."""

    SETUP = "setup"
    STEP = "step"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    ACTIVATIONS = "activations"
    GRADIENTS = "gradients"
    OPTIMIZER_STATES = "optimizer_states"
    HEAP = "heap"
    HEAP_TRACE = "heap_trace"
    CUDA = "cuda"
    TIMING = "timing"
    OP_GROUPS = "op_groups"
    MFU = "mfu"
    DEVICE = "device"
    CHANGES = "model_changes"
    ADVISOR = "advisor"
    PUBLISH = "publish"
    SNAPSHOT = "snapshot"
    OOM = "oom"


class _Section:
    """``with guard(feature):`` — one preallocated object per feature (the hot path allocates nothing)."""

    __slots__ = ("_feature", "_guard")

    def __init__(self, guard: Guard, feature: Feature) -> None:
        self._guard = guard
        self._feature = feature

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> bool:
        if exc is None or not isinstance(exc, Exception):
            return False
        self._guard.fail(self._feature, exc)
        return True


class Guard:
    """Which features still measure, and why the others stopped."""

    def __init__(self) -> None:
        self._errors: dict[Feature, str] = {}
        # what is off: read directly on the hot path (``Feature.X not in guard.off``: no call)
        self.off: set[Feature] = set()
        self._sections = {f: _Section(self, f) for f in Feature}
        self.version = 0  # counts changes to what is off and why (a snapshot's error text)
        self.listeners: list[Callable[[], None]] = []  # told of every change (the tracker's rest gate)

    def __call__(self, feature: Feature) -> _Section:
        return self._sections[feature]

    def wrap(self, feature: Feature, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` run inside ``feature``'s section (for callbacks torch calls)."""
        section = self._sections[feature]

        def guarded(*args: Any, **kwargs: Any) -> Any:
            with section:
                return fn(*args, **kwargs)
            return None

        return guarded

    def ok(self, feature: Feature) -> bool:
        return feature not in self.off

    def all_ok(self, *features: Feature) -> bool:
        return not any(f in self.off for f in features)

    def fail(self, feature: Feature, exc: BaseException) -> None:
        """Log once per feature, remember why, and stop measuring it."""
        self.off.add(feature)
        self.version += 1
        for listener in self.listeners:
            listener()
        if feature in self._errors:
            return
        text = f"{feature.value}: {type(exc).__name__}: {exc}"
        self._errors[feature] = text[:MAX_TEXT]
        log.warning(
            "anatomy: %s failed (%s: %s); it is reported as unmeasured from now on",
            feature.value,
            type(exc).__name__,
            exc,
        )
        log.debug("anatomy: where %s failed", feature.value, exc_info=exc)  # for a bug report

    def turn_off(self, feature: Feature, reason: str | None = None) -> None:
        """Stop measuring ``feature`` without an exception (unavailable here); ``reason`` goes to the
        snapshot's error text."""
        self.off.add(feature)
        self.version += 1
        for listener in self.listeners:
            listener()
        if reason is not None:
            self._errors.setdefault(feature, f"{feature.value}: {reason}"[:MAX_TEXT])

    @property
    def error(self) -> str | None:
        if not self._errors:
            return None
        return "; ".join(self._errors.values())[:MAX_TEXT]
