"""The monitor's refresh interval: its default, its bounds and the steps ``+``/``-`` move through.

Shared by the command line (``--interval``, ``--help``) and the app, so neither imports the other.
Stdlib only.
"""

from __future__ import annotations

DEFAULT_INTERVAL = 2.0  # as nvitop: the screen stays fresh at half the CPU of 1 s (benchmarks/bench_tui.py)
MIN_INTERVAL = 0.1
MAX_INTERVAL = 3600.0
# The keys step through these (at most 2 refreshes a second: a monitor must stay cheap); an explicit
# --interval may go lower, within the bounds above.
INTERVAL_STEPS: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0)


def clamp_interval(value: float) -> float:
    return min(MAX_INTERVAL, max(MIN_INTERVAL, float(value)))


def next_interval(current: float, direction: int) -> float:
    """The next step of INTERVAL_STEPS above (direction > 0) or below the current interval."""
    if direction > 0:
        bigger = [s for s in INTERVAL_STEPS if s > current + 1e-9]
        return bigger[0] if bigger else current
    smaller = [s for s in INTERVAL_STEPS if s < current - 1e-9]
    return smaller[-1] if smaller else current


def describe_interval(seconds: float) -> str:
    """``every 2 s``, ``every second``: how --help and README say it."""
    return "every second" if seconds == 1.0 else f"every {seconds:g} s"
