"""What one pass over NVML yields (``NvmlReading``), and what the NVML source keeps per GPU between
passes (``DeviceState``): plain slotted classes, no dataclasses (``--once`` imports this module, and a
dataclass definition costs ~0.5 ms of its start-up).
"""

from __future__ import annotations

from tui.sources.model import GpuInfo, GpuProcess, NvmlStatus

# typing is not imported at run time (~3 ms of --once start-up); the names are for type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# Fields a caller may leave unasked (``NvmlSource(omit=...)``): what the text report never prints.
OMITTABLE_FIELDS = ("uuid", "nvml_version", "process_utilization")
# Slow fields that only nvidia-smi's view shows, which the exporter does not export: it leaves them
# unasked (None), one NVML call per GPU and slow refresh each.
VIEW_ONLY_FIELDS = ("persistence_mode", "display_active", "performance_state", "compute_mode")

# Field names of GpuInfo per cache tier.
IDENTITY_FIELDS = ("name", "uuid", "bus_id")
SLOW_FIELDS = (
    "persistence_mode",
    "display_active",
    "ecc_volatile_uncorrected",
    "fan_percent",
    "temperature_c",
    "performance_state",
    "power_limit_w",
    "compute_mode",
    "mig_mode",
)
FAST_FIELDS = (
    "memory_total",
    "memory_used",
    "memory_free",
    "memory_reserved",
    "gpu_util",
    "memory_util",
    "power_w",
)



class NvmlReading:
    """One pass over NVML: the status, every GPU, every GPU process (not yet host-enriched).

    ``calls``: the NVML C calls this pass made (fallback attempts included). A plain slotted class,
    not a dataclass: defining a dataclass costs ~0.5 ms of start-up, which ``--once`` pays.
    """

    __slots__ = ("calls", "gpus", "processes", "status")

    def __init__(
        self,
        status: NvmlStatus,
        gpus: tuple[GpuInfo, ...] = (),
        processes: tuple[GpuProcess, ...] = (),
        calls: int = 0,
    ) -> None:
        self.status = status
        self.gpus = gpus
        self.processes = processes
        self.calls = calls

    def _key(self) -> tuple[Any, ...]:
        return (self.status, self.gpus, self.processes, self.calls)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NvmlReading) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"NvmlReading(status={self.status!r}, gpus={self.gpus!r}, processes={self.processes!r}, "
            f"calls={self.calls!r})"
        )


class DeviceState:
    """What one GPU's earlier passes learned: its handle, cached tiers, and buffer sizes."""


    __slots__ = (
        "error",
        "fast",
        "fast_at",
        "handle",
        "identity",
        "index",
        "lost",
        "proc_capacity",
        "processes",
        "slow",
        "slow_at",
        "util_capacity",
        "util_supported",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.lost = False
        self.error: str | None = None
        self.identity: dict[str, Any] | None = None
        self.slow: dict[str, Any] | None = None
        self.slow_at = float("-inf")
        self.fast: dict[str, Any] | None = None
        self.fast_at = float("-inf")
        self.processes: tuple[GpuProcess, ...] = ()
        # Last list length per process kind, to size the next read's buffer.
        self.proc_capacity: dict[str, int] = {}
        # nvmlDeviceGetProcessUtilization: the last answer's length (to size the next buffer), and
        # False once it said NOT_SUPPORTED.
        self.util_capacity = 0
        self.util_supported = True


def decode(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def format_cuda_version(version: int | None) -> str | None:
    """NVML's integer CUDA driver version (12040) as nvidia-smi prints it ("12.4")."""
    if version is None or version <= 0:
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def pci_bus_id(info: Any) -> str | None:
    """nvidia-smi's bus id ("00000000:18:00.0") of an nvmlPciInfo_t of any version; None: none in it."""
    # The string moved between struct versions (busIdLegacy → busId); the numbers are the last resort.
    text = decode(info.busId) or decode(info.busIdLegacy)
    if text:
        domain, sep, rest = text.partition(":")
        # Legacy ids have a 4-digit domain ("0000:18:00.0"); nvidia-smi prints 8 digits.
        return f"{domain.zfill(8)}{sep}{rest}".upper() if sep else text
    if info.domain or info.bus or info.device:
        return f"{info.domain:08X}:{info.bus:02X}:{info.device:02X}.0"
    return None


def fast_fields(memory: Any, util: Any, power_mw: Any) -> dict[str, Any]:
    """The fast tier's fields from NVML's memory info, utilization rates and power usage (each None where
    NVML had none)."""
    return {
        "memory_total": None if memory is None else int(memory.total),
        "memory_used": None if memory is None else int(memory.used),
        "memory_free": None if memory is None else int(memory.free),
        "memory_reserved": int(memory.reserved) if hasattr(memory, "reserved") else None,
        "gpu_util": None if util is None else int(util.gpu),
        "memory_util": None if util is None else int(util.memory),
        "power_w": None if power_mw is None else power_mw / 1000.0,
    }
