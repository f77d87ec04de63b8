"""Values that change over time: a base (or piecewise-linear keyframes) plus a sine wave.

Time is seconds since the simulated library was installed. In JSON a curve is either a plain number
(a constant) or an object with the keys of :class:`Curve`.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any


class ScenarioError(ValueError):
    """A scenario (dict or JSON file) that cannot be turned into a simulated box."""


_CURVE_KEYS = {"base", "amplitude", "period_s", "phase_s", "keyframes", "repeat", "minimum", "maximum"}


@dataclass(frozen=True)
class Curve:
    """``value(t) = level(t) + amplitude * sin(2π (t + phase_s) / period_s)``, clamped to [minimum, maximum].

    ``level(t)`` is ``base``, or, when ``keyframes`` ((t, value) pairs, t ascending) are given, the
    piecewise-linear interpolation between them: held flat after the last one, or looping over the
    keyframes' span when ``repeat`` is set.
    """

    base: float = 0.0
    amplitude: float = 0.0
    period_s: float = 60.0
    phase_s: float = 0.0
    keyframes: tuple[tuple[float, float], ...] = field(default=())
    repeat: bool = False
    minimum: float | None = None
    maximum: float | None = None

    def __post_init__(self) -> None:
        if self.period_s <= 0:
            raise ScenarioError(f"curve period_s must be positive, got {self.period_s}")
        times = [t for t, _ in self.keyframes]
        if times != sorted(times):
            raise ScenarioError("curve keyframes must be in ascending time order")

    @classmethod
    def constant(cls, value: float) -> Curve:
        return cls(base=float(value))

    def at(self, t: float) -> float:
        value = self._level(t)
        if self.amplitude:
            value += self.amplitude * math.sin(2.0 * math.pi * (t + self.phase_s) / self.period_s)
        if self.minimum is not None:
            value = max(self.minimum, value)
        if self.maximum is not None:
            value = min(self.maximum, value)
        return value

    def _level(self, t: float) -> float:
        frames = self.keyframes
        if not frames:
            return self.base
        if len(frames) == 1:
            return frames[0][1]
        start, end = frames[0][0], frames[-1][0]
        if self.repeat and end > start and t > end:
            t = start + (t - start) % (end - start)
        if t <= start:
            return frames[0][1]
        if t >= end:
            return frames[-1][1]
        i = bisect_right([ft for ft, _ in frames], t)
        (t0, v0), (t1, v1) = frames[i - 1], frames[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else v1

    @property
    def is_constant(self) -> bool:
        return not self.amplitude and not self.keyframes

    def to_json_value(self) -> float | dict[str, Any]:
        if self.is_constant and self.minimum is None and self.maximum is None:
            return self.base
        out: dict[str, Any] = {"base": self.base}
        if self.amplitude:
            out.update(amplitude=self.amplitude, period_s=self.period_s, phase_s=self.phase_s)
        if self.keyframes:
            out["keyframes"] = [[t, v] for t, v in self.keyframes]
            out["repeat"] = self.repeat
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        return out


def curve_from_json(value: Any, what: str) -> Curve:
    """A number or a curve object (see :class:`Curve`); ``what`` names the field in error messages."""
    if isinstance(value, Curve):
        return value
    if isinstance(value, bool):
        raise ScenarioError(f"{what}: expected a number or a curve object, got a boolean")
    if isinstance(value, int | float):
        return Curve.constant(value)
    if not isinstance(value, dict):
        raise ScenarioError(f"{what}: expected a number or a curve object, got {type(value).__name__}")
    unknown = set(value) - _CURVE_KEYS
    if unknown:
        raise ScenarioError(f"{what}: unknown curve keys {sorted(unknown)}")
    try:
        frames = tuple((float(t), float(v)) for t, v in value.get("keyframes", ()))
        return Curve(
            base=float(value.get("base", frames[0][1] if frames else 0.0)),
            amplitude=float(value.get("amplitude", 0.0)),
            period_s=float(value.get("period_s", 60.0)),
            phase_s=float(value.get("phase_s", 0.0)),
            keyframes=frames,
            repeat=bool(value.get("repeat", False)),
            minimum=None if value.get("minimum") is None else float(value["minimum"]),
            maximum=None if value.get("maximum") is None else float(value["maximum"]),
        )
    except ScenarioError as exc:
        raise ScenarioError(f"{what}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{what}: malformed curve ({exc})") from None
