"""Plain data objects the data layer produces and widgets/renderers consume.

Every optional field is ``None`` where the value is N/A: unsupported by the GPU, missing on an
older driver, not permitted, or the process/GPU is gone. Units are base units: bytes, watts,
degrees Celsius, percent, seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NvmlStatus:
    available: bool
    reason: str | None = None  # why NVML is unavailable, in words a user can act on
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # "12.4"
    nvml_version: str | None = None


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str | None = None
    uuid: str | None = None
    persistence_mode: bool | None = None
    bus_id: str | None = None  # "00000000:00:04.0"
    display_active: bool | None = None
    ecc_volatile_uncorrected: int | None = None
    fan_percent: int | None = None
    temperature_c: int | None = None
    performance_state: int | None = None  # 0 for P0
    power_w: float | None = None
    power_limit_w: float | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    memory_free: int | None = None
    memory_reserved: int | None = None  # driver-reserved (nvmlMemory_v2); None on v1 fallback
    gpu_util: int | None = None
    memory_util: int | None = None
    compute_mode: str | None = None  # "Default", "Exclusive_Process", "Prohibited"
    mig_mode: bool | None = None  # current MIG mode; None = N/A
    lost: bool = False  # fell off the bus / unreachable: every other field is None
    error: str | None = None


@dataclass(frozen=True)
class GpuProcess:
    gpu_index: int
    pid: int
    type: str  # "C", "G" or "C+G"
    gpu_memory: int | None = None
    gpu_instance_id: int | None = None  # MIG only
    compute_instance_id: int | None = None  # MIG only
    # nvmlDeviceGetProcessUtilization's latest sample: SM % and memory-bandwidth % (NVML's "memUtil",
    # the share of time device memory was read or written); None where the GPU does not sample them.
    sm_util: int | None = None
    memory_bw_util: int | None = None
    # psutil enrichment; None where the process exited or belongs to another user/container
    name: str | None = None
    user: str | None = None
    command: str | None = None
    cpu_percent: float | None = None
    host_rss: int | None = None
    running_time_s: float | None = None
    started_at: float | None = None  # seconds since the epoch: with the PID, identifies the process
    alive: bool = True


@dataclass(frozen=True)
class HostInfo:
    cpu_percent: float | None = None
    cpu_count: int | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    memory_available: int | None = None
    swap_total: int | None = None
    swap_used: int | None = None
    load_avg: tuple[float, float, float] | None = None
    hostname: str | None = None


class SourceError:
    """A data source's own failure, reported beside what it read (never dressed up as a process).

    ``source`` says which one failed ("training data" for the anatomy source); ``message`` says why, in
    words a user can act on. Immutable; a slotted class, not a dataclass: ``--once`` imports this module
    and a dataclass definition costs ~0.5 ms of its start-up."""

    __slots__ = ("message", "source")
    source: str
    message: str

    def __init__(self, source: str, message: str) -> None:
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "message", message)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"SourceError is immutable: cannot set {name}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SourceError) and (self.source, self.message) == (other.source, other.message)

    def __hash__(self) -> int:
        return hash((self.source, self.message))

    def __repr__(self) -> str:
        return f"SourceError(source={self.source!r}, message={self.message!r})"

    def __str__(self) -> str:
        return f"{self.source}: {self.message}"


@dataclass(frozen=True)
class MachineSnapshot:
    time: float
    nvml: NvmlStatus
    gpus: tuple[GpuInfo, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    host: HostInfo = field(default_factory=HostInfo)
