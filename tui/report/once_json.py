"""``anatomy-top --once --json``: one JSON document for scripts (schema in .notes/once_json_schema.md).

Base units throughout (bytes, watts, °C, percent, seconds); ``null`` wherever a value is N/A. Strings are
kept verbatim (a process named ``train.py [rank0]`` stays exactly that).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from datetime import datetime, timezone
from typing import Any

from tui.sources.model import GpuInfo, GpuProcess, HostInfo, MachineSnapshot

SCHEMA = "anatomy-top/once"
SCHEMA_VERSION = 1


def _finite(value: Any) -> Any:
    # JSON has no NaN/Infinity; a non-finite float is as good as unknown.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else _finite(v)) for k, v in d.items()}


def gpu_dict(gpu: GpuInfo) -> dict[str, Any]:
    return _plain(asdict(gpu))


def process_dict(proc: GpuProcess) -> dict[str, Any]:
    return _plain(asdict(proc))


def host_dict(host: HostInfo) -> dict[str, Any]:
    return _plain(asdict(host))


def render_json(
    machine: MachineSnapshot,
    training: list[dict[str, Any]] | None = None,
    *,
    nvml_calls: int | None = None,
) -> dict[str, Any]:
    """The ``--once --json`` document. ``training`` (each publishing process's latest anatomy, built by
    ``tui.report.anatomy_json``) is placed as given; ``nvml_calls`` is what this snapshot cost."""
    nvml = machine.nvml
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "time": machine.time,
        "time_iso": datetime.fromtimestamp(machine.time, tz=timezone.utc).isoformat(),
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
    }
