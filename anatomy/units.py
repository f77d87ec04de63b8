"""The one byte formatter: the hook's advisor, `anatomy-top plan` and the monitor (tui.format re-exports
it) print sizes alike. Stdlib only, so the monitor can import it without torch."""

from __future__ import annotations

import math

NA = "N/A"
BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def fmt_bytes(n: float | None, na: str = NA) -> str:
    """Binary units: ``512 B``, ``42.6 MiB``, ``1.25 GiB`` (GiB and above with two decimals)."""
    if n is None or not math.isfinite(float(n)):
        return na
    sign = "-" if n < 0 else ""
    value = abs(float(n))
    if value < 1024:
        return f"{sign}{int(value)} B"
    for i, unit in enumerate(BINARY_UNITS):
        value /= 1024.0
        if value < 1024 or i == len(BINARY_UNITS) - 1:
            decimals = 1 if unit in ("KiB", "MiB") else 2
            return f"{sign}{value:.{decimals}f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover
