"""Human units for every figure anatomy-top shows: bytes, shares, durations, rates, counts.

Pure functions of plain numbers, stdlib only, shared by the Textual widgets and the text reports so a
number reads the same everywhere (tests compare the screen against these functions' output exactly).
``None`` means N/A and is rendered as ``NA`` (or ``UNMEASURED`` where a measurement is missing).
"""

from __future__ import annotations

import math

from anatomy.units import BINARY_UNITS, fmt_bytes

NA = "N/A"
# fmt_bytes lives in anatomy.units (one formatter for the hook, plan and the monitor); re-exported here.
UNMEASURED = "unmeasured"

_SI_SUFFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_COUNT_SUFFIXES = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k"))


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def fmt_mib(n: float | None, na: str = NA) -> str:
    """nvidia-smi's style: whole MiB without a space (``40536MiB``)."""
    if n is None or not _finite(float(n)):
        return na
    return f"{int(n) // (1024 * 1024)}MiB"


def fmt_bytes_pair(used: float | None, total: float | None, na: str = NA) -> str:
    """``12.3 / 80.0 GiB``: both figures in the unit of the total, so they line up."""
    if used is None or total is None:
        return f"{fmt_bytes(used, na)} / {fmt_bytes(total, na)}"
    unit_index = 0
    scaled_total = float(total)
    while scaled_total >= 1024 and unit_index < len(BINARY_UNITS):
        scaled_total /= 1024.0
        unit_index += 1
    if unit_index == 0:
        return f"{int(used)} / {int(total)} B"
    divisor = 1024.0**unit_index
    unit = BINARY_UNITS[unit_index - 1]
    return f"{used / divisor:.1f} / {total / divisor:.1f} {unit}"


def fmt_percent(p: float | None, decimals: int = 0, na: str = NA) -> str:
    """A value already in percent: ``fmt_percent(37.5) == '38%'``."""
    if not _finite(p):
        return na
    assert p is not None
    return f"{p:.{decimals}f}%"


def fmt_share(fraction: float | None, decimals: int = 1, na: str = NA) -> str:
    """A fraction in [0, 1] as percent: ``fmt_share(0.1234) == '12.3%'``."""
    if not _finite(fraction):
        return na
    assert fraction is not None
    return f"{fraction * 100:.{decimals}f}%"


def fmt_duration(seconds: float | None, na: str = NA) -> str:
    """Running time like ps: ``05:06``, ``04:05:06``, ``3d 04:05:06``."""
    if not _finite(seconds):
        return na
    assert seconds is not None
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{minutes:02d}:{secs:02d}"


def fmt_elapsed(seconds: float | None, na: str = NA) -> str:
    """A process's running time at the precision a monitor needs: ``42s``, ``17m``, ``5h07m``,
    ``3d04h``. Past the first minute it changes at most once a minute, so a table of long-running
    processes does not repaint every row on every refresh just because a seconds digit moved."""
    if not _finite(seconds):
        return na
    assert seconds is not None
    total = max(0, int(seconds))
    if total < 60:
        return f"{total}s"
    minutes = total // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def fmt_seconds(seconds: float | None, na: str = NA) -> str:
    """Short spans such as step times: ``850 µs``, ``412 ms``, ``1.23 s``, ``75.0 s``."""
    if not _finite(seconds):
        return na
    assert seconds is not None
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 10.0:
        return f"{seconds:.2f} s"
    return f"{seconds:.1f} s"


def fmt_si(value: float | None, decimals: int = 1, na: str = NA) -> str:
    """SI suffixes for rates: ``9.9k``, ``1.2M``; below 1000 keeps ``decimals``."""
    if not _finite(value):
        return na
    assert value is not None
    for threshold, suffix in _SI_SUFFIXES:
        if abs(value) >= threshold:
            return f"{value / threshold:.{decimals}f}{suffix}"
    return f"{value:.{decimals}f}"


def fmt_rate(value: float | None, unit: str, na: str = NA) -> str:
    """``19.4 samples/s``, ``9.9k tokens/s``."""
    if not _finite(value):
        return na
    return f"{fmt_si(value)} {unit}/s"


def fmt_count(n: float | None, na: str = NA) -> str:
    """Parameter counts: ``110.1M``, ``1.30B``, ``512``."""
    if not _finite(None if n is None else float(n)):
        return na
    assert n is not None
    for threshold, suffix in _COUNT_SUFFIXES:
        if abs(n) >= threshold:
            decimals = 2 if suffix in ("B", "T") else 1
            return f"{n / threshold:.{decimals}f}{suffix}"
    return f"{int(n)}"


def fmt_params(count: int, trainable: int | None = None, quantization: str | None = None) -> str:
    """A model's parameters as every view shows them: ``592.5k params (8.2k trainable) · nf4``. The
    trainable count only when some parameters are frozen (a LoRA adapter); the weight format when the
    weights are quantized (an older hook sends neither)."""
    text = f"{fmt_count(count)} params"
    if trainable is not None and trainable != count:
        text += f" ({fmt_count(trainable)} trainable)"
    if quantization:
        text += f" · {quantization}"
    return text


def fmt_bytes_per_param(value: float | None, na: str = UNMEASURED) -> str:
    """Bytes per parameter with two decimals (``4.00``, ``18.00``)."""
    if not _finite(value):
        return na
    assert value is not None
    return f"{value:.2f}"


def fmt_watts(w: float | None, na: str = NA) -> str:
    if not _finite(w):
        return na
    assert w is not None
    return f"{w:.0f}W"


def fmt_power(usage: float | None, cap: float | None, na: str = NA) -> str:
    """nvidia-smi's ``Pwr:Usage/Cap``: ``250W / 700W``."""
    return f"{fmt_watts(usage, na)} / {fmt_watts(cap, na)}"


def fmt_temp(celsius: float | None, na: str = NA) -> str:
    if not _finite(None if celsius is None else float(celsius)):
        return na
    assert celsius is not None
    return f"{celsius:.0f}C"


def fmt_tflops(tflops: float | None, na: str = NA) -> str:
    """Achieved throughput in TFLOP/s: ``41.3 TFLOP/s`` (``0.012 TFLOP/s`` on a CPU)."""
    if not _finite(tflops):
        return na
    assert tflops is not None
    decimals = 1 if abs(tflops) >= 10 else (2 if abs(tflops) >= 0.1 else 3)
    return f"{tflops:.{decimals}f} TFLOP/s"


def fmt_bool(value: bool | None, yes: str = "On", no: str = "Off", na: str = NA) -> str:
    if value is None:
        return na
    return yes if value else no
