"""Charts of a recorded run as plain geometry: stacked areas, lines, event rules and labels in pixel
coordinates. One model, two renderers: inline SVG for the HTML page (:mod:`tui.runreport.svg`) and a
PNG drawn with Pillow (:mod:`tui.runreport.png`), so the picture and the page cannot disagree.

Stdlib only. Series are thinned to at most ``MAX_POINTS`` points (buckets of equal x range, cut as the
monitor's whole-run sparklines cut them: their means; a bucket's largest value for peaks) so a
100,000-step run makes a page of a few hundred kilobytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from anatomy.units import fmt_bytes
from tui.format import fmt_seconds
from tui.step_buckets import MEAN, buckets

MAX_POINTS = 400
WIDTH, HEIGHT = 560, 230
LEFT, RIGHT, TOP, BOTTOM = 62, 24, 12, 34
GRID = "#3a3a3a"
AXIS_TEXT = "#b8b8b8"
EVENT_COLOUR = "#e0a030"
OOM_COLOUR = "#ff4040"

Point = tuple[float, float]


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    xs: Sequence[float]
    ys: Sequence[float | None]


@dataclass(frozen=True)
class Event:
    x: float
    label: str
    oom: bool = False


@dataclass(frozen=True)
class Shape:
    """One drawable: ``kind`` is polygon (filled), line, rule (dashed straight line) or text."""

    kind: str
    points: tuple[Point, ...]
    colour: str
    name: str = ""
    text: str = ""
    anchor: str = "start"  # text: start, middle, end


@dataclass
class Chart:
    id: str
    title: str
    unit: str  # bytes, seconds, rate, ratio, share
    stacked: list[Series] = field(default_factory=list)
    lines: list[Series] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    x_label: str = "step"
    width: int = WIDTH
    height: int = HEIGHT
    y_max: float | None = None  # a shared scale (ranks side by side); None: this chart's own data

    def data_max(self) -> float:
        """The largest value drawn: the top of the stack or of a line."""
        tops = [0.0] * (len(self.stacked[0].xs) if self.stacked else 0)
        for s in self.stacked:
            for i, y in enumerate(s.ys[: len(tops)]):
                tops[i] += y or 0.0
        return max(tops + [y for s in self.lines for y in s.ys if y is not None] + [0.0])

    @property
    def empty(self) -> bool:
        return not any(len(s.xs) for s in self.stacked + self.lines)

    @property
    def points(self) -> int:
        return sum(sum(1 for y in s.ys if y is not None) for s in self.stacked + self.lines)

    def shapes(self) -> list[Shape]:
        return _layout(self)


def thin(
    xs: Sequence[float], ys: Sequence[float | None], how: str = MEAN
) -> tuple[list[float], list[float | None]]:
    """At most MAX_POINTS points: the x range cut into MAX_POINTS equal buckets
    (:func:`tui.step_buckets.buckets`), each non-empty one a point at the mean x of its points (the
    first and last bucket at the data's first and last x, so the chart spans the whole run) with the
    mean (or max) of its measured values (None when it has none).

    By x, not by point count: a recorded run keeps its recent past in full and its older history
    thinned, so a bucket of a fixed number of points would squeeze the thin early part into one point."""
    if len(xs) <= MAX_POINTS:
        return list(xs), list(ys)
    used = [b for b in buckets(xs, ys, MAX_POINTS, how) if b.count]
    out_x = [b.x for b in used if b.x is not None]
    out_x[0], out_x[-1] = min(xs), max(xs)
    return out_x, [b.value for b in used]


def formatter(unit: str) -> Callable[[float], str]:
    if unit == "bytes":
        return lambda v: fmt_bytes(int(v))
    if unit == "seconds":
        return lambda v: fmt_seconds(v)
    if unit == "share" or unit == "ratio":
        return lambda v: f"{v * 100:.0f}%"
    return lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def _nice(top: float) -> float:
    if top <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(top))
    for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if m * exp >= top:
            return m * exp
    return 10 * exp


def _layout(chart: Chart) -> list[Shape]:
    shapes: list[Shape] = []
    all_x = [x for s in chart.stacked + chart.lines for x in s.xs]
    if not all_x:
        return [
            Shape("text", ((chart.width / 2, chart.height / 2),), AXIS_TEXT, text="no data", anchor="middle")
        ]
    x0, x1 = min(all_x + [e.x for e in chart.events]), max(all_x + [e.x for e in chart.events])
    if x1 <= x0:
        x1 = x0 + 1
    y_max = chart.y_max if chart.y_max is not None else chart.data_max()
    y_top = 1.0 if chart.unit == "share" else _nice(y_max * 1.05)
    pw, ph = chart.width - LEFT - RIGHT, chart.height - TOP - BOTTOM

    def px(x: float) -> float:
        return round(LEFT + (x - x0) / (x1 - x0) * pw, 1)

    def py(y: float) -> float:
        return round(TOP + ph - min(y, y_top) / y_top * ph, 1)

    fmt = formatter(chart.unit)
    for i in range(5):  # horizontal grid and y labels
        v = y_top * i / 4
        shapes.append(Shape("rule", ((LEFT, py(v)), (LEFT + pw, py(v))), GRID))
        shapes.append(Shape("text", ((LEFT - 4, py(v) + 4),), AXIS_TEXT, text=fmt(v), anchor="end"))
    for i in range(5):  # x labels
        v = x0 + (x1 - x0) * i / 4
        shapes.append(Shape("text", ((px(v), TOP + ph + 14),), AXIS_TEXT, text=f"{v:,.0f}", anchor="middle"))
    shapes.append(
        Shape("text", ((LEFT + pw, chart.height - 4),), AXIS_TEXT, text=chart.x_label, anchor="end")
    )
    if chart.stacked:
        xs = chart.stacked[0].xs
        below = [0.0] * len(xs)
        for s in chart.stacked:
            above = [b + (y or 0.0) for b, y in zip(below, s.ys, strict=True)]
            if any(y for y in s.ys):
                upper = [(px(x), py(a)) for x, a in zip(xs, above, strict=True)]
                lower = [(px(x), py(b)) for x, b in zip(xs, below, strict=True)]
                shapes.append(Shape("polygon", tuple(upper + lower[::-1]), s.colour, name=s.name))
            below = above
    for s in chart.lines:
        run: list[Point] = []
        for x, y in zip(s.xs, s.ys, strict=True):
            if y is None:  # a gap: unmeasured, never drawn as zero
                if len(run) > 1:
                    shapes.append(Shape("line", tuple(run), s.colour, name=s.name))
                run = []
                continue
            run.append((px(x), py(y)))
        if run:
            shapes.append(Shape("line", tuple(run if len(run) > 1 else run * 2), s.colour, name=s.name))
    for e in chart.events:
        colour = OOM_COLOUR if e.oom else EVENT_COLOUR
        shapes.append(
            Shape("rule", ((px(e.x), TOP), (px(e.x), TOP + ph)), colour, name="event", text=e.label)
        )
    return shapes
