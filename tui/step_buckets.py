"""A series over steps cut into buckets of equal step ranges, each summarised: the points of the run
report's charts and the cells of the monitor's whole-run sparklines. Stdlib only.

By step range, not by value count: a recorded run keeps its recent past in full and its older history
thinned on a step grid (:mod:`anatomy.record_log`), so buckets of a fixed number of values would give the
dense recent part far more of a chart than its share of the steps (a 100,000-step run: its last tenth
holds about a third of the kept rows). Shared here so the report (:mod:`tui.runreport.charts`), the
replay (:mod:`tui.replay`) and the live monitor's follower of a record (:mod:`tui.sources.run_history`)
cut a run the same way, without the data layer importing the report or the view layer.

Summaries: ``max`` for a peak (a memory sparkline must show the largest, not smooth it away), ``mean``
for a time or a rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MEAN, MAX = "mean", "max"


@dataclass(frozen=True)
class Bucket:
    """One bucket: the step range ``[start, end)`` (the last bucket includes its end), how many values
    fall in it, their mean position and the summary of those measured (None: none measured)."""

    start: float
    end: float
    count: int
    x: float | None
    value: float | None


def buckets(
    xs: Sequence[float],
    ys: Sequence[float | None],
    n: int,
    how: str = MEAN,
    firsts: Sequence[float] | None = None,
) -> list[Bucket]:
    """The range from the first step to the last cut into ``n`` equal buckets, each summarising the
    values in it (``how``: MEAN or MAX).

    ``xs``: each value's step (a thinned row's last step); ``firsts``: the first step each value stands
    for (a recorded row merged from ``k`` steps stands for ``x - k + 1`` to ``x``; default: ``xs``, one
    step each). Steps spanning several buckets are whole numbers. A value standing for several steps
    counts in every bucket its steps reach: the largest in each (its steps' peak may lie in any of
    them), and in a mean weighed by its steps there, so a bucket half covered by one row of 128 steps
    and half by 64 rows of one step weighs the two halves equally."""
    if n <= 0 or not xs:
        return []
    lo, hi = min(xs if firsts is None else firsts), max(xs)
    width = (hi - lo) / n
    scale = n / (hi - lo) if hi > lo else 0.0
    pos = [0.0] * n
    count = [0] * n
    top: list[float | None] = [None] * n
    total = [0.0] * n
    weight = [0.0] * n
    if firsts is None:  # one step each, one bucket each: the report's long series, kept fast
        vals: list[list[float]] = [[] for _ in range(n)]
        for x, y in zip(xs, ys, strict=True):
            b = min(int((x - lo) * scale), n - 1)
            pos[b] += x
            count[b] += 1
            if y is not None:
                vals[b].append(y)
        for b, v in enumerate(vals):
            if v:
                top[b], total[b], weight[b] = max(v), sum(v), len(v)
    else:  # a row of several steps may reach several buckets
        last = n - 1
        for x, y, first in zip(xs, ys, firsts, strict=True):
            b = int((x - lo) * scale)
            b = last if b > last else b
            a = int((first - lo) * scale)
            a = last if a > last else a
            if a == b:  # most rows: within one bucket (inlined, a live monitor redoes this)
                pos[b] += x
                count[b] += 1
                if y is not None:
                    t = top[b]
                    top[b] = y if t is None or y > t else t
                    w = x - first + 1
                    total[b] += y * w
                    weight[b] += w
                continue
            for k in range(a, b + 1):
                pos[k] += x
                count[k] += 1
                if y is None:
                    continue
                t = top[k]
                top[k] = y if t is None or y > t else t
                # In a mean, weighed by its steps in this bucket's range (at least one: it reaches it).
                end = x + 1 if k == last else min(x + 1, math.ceil(lo + (k + 1) * width))
                w = max(end - max(first, math.ceil(lo + k * width)), 1)
                total[k] += y * w
                weight[k] += w
    out = []
    for k in range(n):
        value = top[k] if how == MAX else total[k] / weight[k] if weight[k] > 0 else None
        end = hi if k == n - 1 else lo + (k + 1) * width
        out.append(Bucket(lo + k * width, end, count[k], pos[k] / count[k] if count[k] else None, value))
    return out


def even_series(
    xs: Sequence[float],
    ys: Sequence[float | None],
    points: int,
    how: str = MEAN,
    firsts: Sequence[float] | None = None,
) -> list[float]:
    """A sparkline's values: the run's steps in ``min(points, its steps)`` buckets of equal step ranges
    (see :func:`buckets`), one value each, so the i-th of n values always stands for the i-th n-th of
    the steps (a sparkline widget that groups values by count then groups step ranges). A bucket with
    no measured value (steps not recorded) repeats the one before it; the steps span those with a
    measured value."""
    starts = xs if firsts is None else firsts
    keep = [i for i, y in enumerate(ys) if y is not None]
    if not keep:
        return []
    mx, my, mf = [xs[i] for i in keep], [ys[i] for i in keep], [starts[i] for i in keep]
    n = max(1, min(points, int(max(mx) - min(mf) + 1)))
    out: list[float] = []
    for bucket in buckets(mx, my, n, how, mf):
        if bucket.value is not None:
            out.append(bucket.value)
        elif out:
            out.append(out[-1])
    return out


__all__ = ["MAX", "MEAN", "Bucket", "buckets", "even_series"]
