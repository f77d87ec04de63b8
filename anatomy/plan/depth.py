"""Deep models from shallow runs.

A deep model is run at 1 and 2 layers per stack (p and 2p when ``config.layer_types`` repeats with
period p) and every layer-dependent figure is extrapolated linearly: the layers of a stack are
identical, so the activations, peaks and temporaries of L layers are a + b*L exactly. An
encoder-decoder model has two stacks and is run three times (both shallow, then each stack deeper
alone): figure(Le, Ld) = base + (enc - base)(Le - p)/p + (dec - base)(Ld - p)/p. The tests check it
against full-depth runs (``exact_depth=True`` runs every layer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anatomy.plan.config import DepthAxis, depth_axes, with_depths
from anatomy.plan.profile import StepProfile

EXTRAPOLATE_ABOVE = 6  # layers in all stacks together; shallower models are always run in full


def _shallow_enough(axes: tuple[DepthAxis, ...]) -> bool:
    return sum(a.depth for a in axes) <= EXTRAPOLATE_ABOVE or all(a.depth <= 2 * a.period for a in axes)


def profile_by_depth(config: Any, exact: bool, run: Callable[[Any], StepProfile]) -> StepProfile:
    """``run(config)`` at full depth, or at shallow depths extrapolated to the config's."""
    axes = depth_axes(config)
    if exact or not axes or _shallow_enough(axes):
        return run(config)
    # Stacks too shallow to gain from extrapolation keep their depth in every run.
    base = {a.attr: (a.period if a.depth > 2 * a.period else a.depth) for a in axes}
    base_profile = run(with_depths(config, base))
    terms: list[tuple[StepProfile, float]] = []
    runs = [tuple(base.values())]
    for axis in axes:
        if base[axis.attr] == axis.depth:
            continue
        deeper = {**base, axis.attr: 2 * axis.period}
        terms.append((run(with_depths(config, deeper)), (axis.depth - axis.period) / axis.period))
        runs.append(tuple(deeper.values()))
    weight_base = 1.0 - sum(w for _, w in terms)
    out = StepProfile.combine([(base_profile, weight_base), *terms])
    return out.with_runs(tuple(runs))
