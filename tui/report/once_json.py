"""``anatomy-top --once --json``: one JSON document for scripts (schema in .notes/once_json_schema.md).

Base units throughout (bytes, watts, °C, percent, seconds); ``null`` wherever a value is N/A. Strings are
kept verbatim (a process named ``train.py [rank0]`` stays exactly that).
"""

from __future__ import annotations

import math
import time
from dataclasses import fields

from tui.sources.model import GpuInfo, GpuProcess, HostInfo, MachineSnapshot

# typing is not imported at run time (~3 ms of --once start-up); the names are for type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SCHEMA = "anatomy-top/once"
SCHEMA_VERSION = 1


def _finite(value: Any) -> Any:
    # JSON has no NaN/Infinity; a non-finite float is as good as unknown.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def iso_utc(seconds: float) -> str:
    """``datetime.fromtimestamp(seconds, timezone.utc).isoformat()`` without importing datetime
    (~1.5 ms of ``--once``): "2025-11-21T09:30:05.250000+00:00", no fraction when it is zero."""
    whole = math.floor(seconds)
    micros = round((seconds - whole) * 1e6)
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    return f"{text}.{micros:06d}+00:00" if micros else f"{text}+00:00"


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(obj: Any) -> dict[str, Any]:
    """A data object's fields as JSON-ready values: tuples become lists, non-finite floats null.

    Not ``dataclasses.asdict``: its recursive deep copy is most of this document's build time, and
    these objects hold only scalars and tuples of scalars.
    """
    cls = type(obj)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(obj))
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(obj, name)
        out[name] = list(value) if isinstance(value, tuple) else _finite(value)
    return out


def gpu_dict(gpu: GpuInfo) -> dict[str, Any]:
    return _plain(gpu)


def process_dict(proc: GpuProcess) -> dict[str, Any]:
    return _plain(proc)


def host_dict(host: HostInfo) -> dict[str, Any]:
    return _plain(host)


def render_json(
    machine: MachineSnapshot,
    training: list[dict[str, Any]] | None = None,
    *,
    nvml_calls: int | None = None,
    jobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ``--once --json`` document. ``training`` (each publishing process's latest anatomy, built by
    ``tui.report.anatomy_json``) is placed as given; ``nvml_calls`` is what this snapshot cost."""
    nvml = machine.nvml
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "time": machine.time,
        "time_iso": iso_utc(machine.time),
        "nvml": {
            "available": nvml.available,
            "reason": nvml.reason,
            "driver_version": nvml.driver_version,
            "cuda_driver_version": nvml.cuda_driver_version,
            "nvml_version": nvml.nvml_version,
            "calls": nvml_calls,
        },
        "gpus": [gpu_dict(g) for g in machine.gpus],
        "processes": [process_dict(p) for p in machine.processes],
        "host": host_dict(machine.host),
        "training": list(training or []),
        "jobs": list(jobs or []),
    }
