"""The data layer's output made safe for a terminal: every string another process chose, cleaned once.

The monitor draws what other processes wrote: a hook's published fields (model class, device, precision,
optimizer, error, out-of-memory text, suggestion title/detail/source), and each process's name, user and
command line. A control character in them is an instruction to the terminal. Rather than trusting each
widget to remember, the monitor passes each sample through here before any widget sees it, so every
view (tables, panes, dialogs, the start-up frame) shows the same cleaned text. ``--once --json`` does not:
JSON escapes controls itself and keeps the published values verbatim.

Stdlib only (plus the data model and ``tui.sanitize``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from anatomy.protocol import Hello, Snapshot, Suggestion
from tui.sanitize import clean
from tui.sources.anatomy_source import TrainingProcess
from tui.sources.model import GpuInfo, GpuProcess, HostInfo, MachineSnapshot

T = TypeVar("T")


def _cleaned(obj: T, names: tuple[str, ...]) -> T:
    """``obj`` with each named string field cleaned; the same object when nothing needed it (the
    common case costs one ``str.isprintable`` per field)."""
    changes: dict[str, Any] = {}
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, str):
            safe = clean(value)
            if safe != value:
                changes[name] = safe
    return dataclasses.replace(obj, **changes) if changes else obj  # type: ignore[type-var]


# Every field that may hold a string another process chose: a vocabulary word decode did not know stays
# the string it was sent as (``Precision | str``).
_HELLO = tuple(f.name for f in dataclasses.fields(Hello) if "str" in str(f.type).split(" | "))
_SNAPSHOT = ("error", "oom", "peak_phase", "memory_source")
_SUGGESTION = ("rule", "title", "detail", "source")
_GPU = tuple(f.name for f in dataclasses.fields(GpuInfo) if f.type in ("str", "str | None"))
_GPU_PROCESS = tuple(f.name for f in dataclasses.fields(GpuProcess) if f.type in ("str", "str | None"))
_HOST = tuple(f.name for f in dataclasses.fields(HostInfo) if f.type in ("str", "str | None"))


def hello(h: Hello | None) -> Hello | None:
    return None if h is None else _cleaned(h, _HELLO)


def snapshot(s: Snapshot | None) -> Snapshot | None:
    if s is None:
        return None
    s = _cleaned(s, _SNAPSHOT)
    suggestions = [_cleaned(x, _SUGGESTION) for x in s.suggestions]
    if any(a is not b for a, b in zip(suggestions, s.suggestions, strict=True)):
        s = dataclasses.replace(s, suggestions=suggestions)
    return s


def suggestion(s: Suggestion) -> Suggestion:
    return _cleaned(s, _SUGGESTION)


def training(processes: list[TrainingProcess]) -> list[TrainingProcess]:
    out = []
    for p in processes:
        h, s = hello(p.hello), snapshot(p.snapshot)
        p = _cleaned(p, ("error", "oom", "rank_group"))
        if h is not p.hello or s is not p.snapshot:
            p = dataclasses.replace(p, hello=h, snapshot=s)
        out.append(p)
    return out


def gpu_process(p: GpuProcess) -> GpuProcess:
    return _cleaned(p, _GPU_PROCESS)


def machine(m: MachineSnapshot) -> MachineSnapshot:
    gpus = tuple(_cleaned(g, _GPU) for g in m.gpus)
    processes = tuple(_cleaned(p, _GPU_PROCESS) for p in m.processes)
    host = _cleaned(m.host, _HOST)
    nvml = _cleaned(m.nvml, ("reason", "driver_version", "cuda_driver_version", "nvml_version"))
    return dataclasses.replace(m, gpus=gpus, processes=processes, host=host, nvml=nvml)
