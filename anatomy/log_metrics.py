"""A snapshot as the flat ``anatomy/...`` metrics that experiment loggers take (TensorBoard, Weights &
Biases, MLflow, Lightning's CSV logger...): the one naming both training callbacks use.

Stdlib only (no torch), so that anything holding a snapshot — a callback, a recorded run — names the
same figures the same way. Names carry their unit as a suffix (``_bytes``, ``_s``, ``_per_s``) because a
logger shows a bare number: a curve called ``weights`` could be MiB or parameters.

- ``anatomy/memory/<component>_bytes``: each memory component of the vocabulary, at its own maximum in
  the step (the snapshot's ``memory``), in bytes;
- ``anatomy/memory/peak_bytes``: the step's peak of memory in use;
- ``anatomy/time/<phase>_s``: the step's time and its forward, backward and optimizer phases, in seconds;
- ``anatomy/samples_per_s``, ``anatomy/tokens_per_s``: throughput;
- ``anatomy/tflops``: achieved TFLOP/s; ``anatomy/mfu``: model FLOPs utilisation (a ratio, 0..1).

A figure the hook could not measure is left out (never logged as 0: a flat zero reads as a fact).
"""

from __future__ import annotations

from anatomy.protocol import Snapshot
from anatomy.vocabulary import Component

PREFIX = "anatomy/"
MEMORY_PREFIX = f"{PREFIX}memory/"
PEAK = f"{MEMORY_PREFIX}peak_bytes"
TIME_PREFIX = f"{PREFIX}time/"
SAMPLES_PER_S = f"{PREFIX}samples_per_s"
TOKENS_PER_S = f"{PREFIX}tokens_per_s"
TFLOPS = f"{PREFIX}tflops"
MFU = f"{PREFIX}mfu"

# The snapshot's Timing fields that are durations; each is logged as anatomy/time/<field>.
_PHASE_TIMES = ("step_s", "forward_s", "backward_s", "optimizer_s")


def memory_name(component: Component) -> str:
    return f"{MEMORY_PREFIX}{component.value}_bytes"


def snapshot_metrics(snap: Snapshot) -> dict[str, float]:
    """The snapshot's anatomy as ``anatomy/...`` metrics (bytes stay ints: exact in loggers that keep
    them; TensorBoard stores every scalar as a float32)."""
    out: dict[str, float] = {}
    for component in Component:  # the vocabulary, so that a new component is logged with no change here
        value = snap.memory.get(component)
        if value is not None:
            out[memory_name(component)] = value
    if snap.peak_bytes is not None:
        out[PEAK] = snap.peak_bytes
    timing = snap.timing
    for field in _PHASE_TIMES:
        seconds = getattr(timing, field)
        if seconds is not None:
            out[f"{TIME_PREFIX}{field}"] = seconds
    rates: tuple[tuple[str, float | None], ...] = (
        (SAMPLES_PER_S, timing.samples_per_s),
        (TOKENS_PER_S, timing.tokens_per_s),
        (TFLOPS, snap.achieved_tflops),
        (MFU, snap.mfu),
    )
    for name, rate in rates:
        if rate is not None:
            out[name] = rate
    return out
