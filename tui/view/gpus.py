"""What the GPU table shows of each GPU (``GpuView``): every field of nvidia-smi's default view already in
words, for the GPU as it is and at its widest values (what the layouts are sized for, so columns stay
put while the numbers move). The table's layouts (tui.widgets.gpu_layout) only fit these to a width."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from tui import format as fmt
from tui.sources.model import GpuInfo

# nvidia-smi's abbreviations for the compute mode.
COMPUTE_SHORT = {
    "Default": "Default",
    "Exclusive_Process": "E. Process",
    "Exclusive_Thread": "E. Thread",
    "Prohibited": "Prohibited",
}


@dataclass(frozen=True)
class GpuFields:
    """One GPU's fields in words (N/A where unknown); the two meters' fills as fractions."""

    memory_fraction: float | None
    memory: str  # "used / total"
    util_fraction: float | None
    util: str
    mem_util: str
    temp: str
    power: str  # "usage / cap"
    fan: str
    perf: str
    ecc: str
    persistence: str
    display: str
    bus: str
    compute: str
    mig: str


@dataclass(frozen=True)
class GpuView:
    gpu: GpuInfo
    name: str  # as NVML names it
    short_name: str  # without the vendor, which is the same on every row
    fields: GpuFields
    widest: GpuFields  # at the widest values the GPU can show: full memory, power at its cap, 100 %

    @property
    def index(self) -> int:
        return self.gpu.index

    @property
    def lost(self) -> bool:
        return self.gpu.lost


def short_name(name: str | None) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3``: the vendor is the same on every row."""
    if not name:
        return fmt.NA
    for prefix in ("NVIDIA GeForce ", "NVIDIA "):
        if name.startswith(prefix) and len(name) > len(prefix):
            return name[len(prefix) :]
    return name


def gpu_fields(gpu: GpuInfo) -> GpuFields:
    fraction = None
    if gpu.memory_used is not None and gpu.memory_total:
        fraction = gpu.memory_used / gpu.memory_total
    compute = fmt.NA if gpu.compute_mode is None else COMPUTE_SHORT.get(gpu.compute_mode, gpu.compute_mode)
    return GpuFields(
        memory_fraction=fraction,
        memory=fmt.fmt_bytes_pair(gpu.memory_used, gpu.memory_total),
        util_fraction=None if gpu.gpu_util is None else gpu.gpu_util / 100.0,
        util=fmt.fmt_percent(gpu.gpu_util),
        mem_util=fmt.fmt_percent(gpu.memory_util),
        temp=fmt.fmt_temp(gpu.temperature_c),
        power=fmt.fmt_power(gpu.power_w, gpu.power_limit_w),
        fan=fmt.fmt_percent(gpu.fan_percent),
        perf=fmt.NA if gpu.performance_state is None else f"P{gpu.performance_state}",
        ecc=fmt.NA if gpu.ecc_volatile_uncorrected is None else str(gpu.ecc_volatile_uncorrected),
        persistence=fmt.fmt_bool(gpu.persistence_mode),
        display=fmt.fmt_bool(gpu.display_active),
        bus=gpu.bus_id or fmt.NA,
        compute=compute,
        mig=fmt.fmt_bool(gpu.mig_mode, yes="Enabled", no="Disabled"),
    )


def widest(gpu: GpuInfo) -> GpuInfo:
    """``gpu`` at the widest values it can show."""

    def at_most(value: float | None, cap: float) -> float | None:
        return None if value is None else max(value, cap)

    return replace(
        gpu,
        memory_used=gpu.memory_total if gpu.memory_total is not None else gpu.memory_used,
        power_w=at_most(gpu.power_w, gpu.power_limit_w or 0.0),
        gpu_util=None if gpu.gpu_util is None else 100,
        fan_percent=None if gpu.fan_percent is None else 100,
        temperature_c=None if gpu.temperature_c is None else max(100, gpu.temperature_c),
        performance_state=None if gpu.performance_state is None else max(10, gpu.performance_state),
    )


def gpu_view(gpu: GpuInfo) -> GpuView:
    return GpuView(
        gpu=gpu,
        name=gpu.name or fmt.NA,
        short_name=short_name(gpu.name),
        fields=gpu_fields(gpu),
        widest=gpu_fields(widest(gpu)),
    )


def gpu_views(gpus: Iterable[GpuInfo]) -> tuple[GpuView, ...]:
    """Each GPU's view, by index."""
    return tuple(gpu_view(g) for g in sorted(gpus, key=lambda g: g.index))
