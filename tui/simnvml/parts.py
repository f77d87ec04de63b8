"""The parts of a simulated box: its GPUs (and their MIG devices), the processes on them, and what goes
wrong (``Faults``). Plain dataclasses; ``tui.simnvml.scenario`` puts them together and gives them a
JSON form. Units: bytes, watts, degrees Celsius, percent, MHz, seconds since install.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tui.simnvml.curves import Curve

MiB = 1024**2
GiB = 1024**3

# Names usable in ``Faults.unsupported``: each makes the getters of that field answer NOT_SUPPORTED.
FIELDS = frozenset(
    {
        "name",
        "uuid",
        "serial",
        "pci",
        "persistence_mode",
        "display_mode",
        "display_active",
        "ecc",
        "fan",
        "temperature",
        "temperature_thresholds",
        "performance_state",
        "power_usage",
        "power_limit",
        "memory",
        "bar1",
        "utilization",
        "encoder",
        "decoder",
        "clocks",
        "max_clocks",
        "compute_mode",
        "mig_mode",
        "processes",
        "process_utilization",
        "architecture",
        "brand",
        "minor_number",
        "board_id",
        "multi_gpu_board",
        "cuda_compute_capability",
        "pcie_throughput",
        "pcie_link",
        "energy",
        "clock_event_reasons",
        "vbios",
        "inforom",
        "index",
    }
)

# Symbols a pre-515 (470-branch) driver lacks: callers must fall back to older entry points.
OLD_DRIVER_MISSING = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetDriverModel_v2",
    "nvmlDeviceGetPciInfoExt",
    "nvmlDeviceGetFanSpeed_v2",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetRunningProcessDetailList",
)

PROCESS_TYPES = ("C", "G", "C+G")
INIT_ERRORS = ("DRIVER_NOT_LOADED", "NO_PERMISSION", "LIB_RM_VERSION_MISMATCH", "UNKNOWN", "GPU_NOT_FOUND")


@dataclass
class SimMigDevice:
    """A MIG device (GPU instance + compute instance) on a GPU whose MIG mode is on."""

    gpu_instance_id: int
    compute_instance_id: int = 0
    profile: str = "1g.10gb"
    memory_total: int = 9856 * MiB
    uuid: str = ""


@dataclass
class SimGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""  # filled from the index when empty
    serial: str = ""
    bus_id: str = ""  # "00000000:18:00.0"; filled from the index when empty
    pci_device_id: int = 0x233010DE
    pci_subsystem_id: int = 0x16C110DE
    memory_total: int = 81559 * MiB
    memory_reserved: int = 528 * MiB  # driver-reserved: in v1 "used", not in v2 "used"
    memory_other_used: int = 0  # used beyond the listed processes (other containers, driver)
    bar1_total: int = 131072 * MiB
    bar1_used: int = 3 * MiB
    power_limit_w: float = 700.0
    power_default_limit_w: float = 700.0
    power_min_limit_w: float = 200.0
    power_max_limit_w: float = 700.0
    fan_percent: Curve | None = None  # None: no fan (SXM boards), NOT_SUPPORTED
    num_fans: int = 0
    temperature_c: Curve = field(default_factory=lambda: Curve.constant(35))
    power_w: Curve = field(default_factory=lambda: Curve.constant(70))
    gpu_util: Curve = field(default_factory=lambda: Curve.constant(0))
    memory_util: Curve = field(default_factory=lambda: Curve.constant(0))
    encoder_util: Curve = field(default_factory=lambda: Curve.constant(0))
    decoder_util: Curve = field(default_factory=lambda: Curve.constant(0))
    pcie_tx_kbps: Curve = field(default_factory=lambda: Curve.constant(0))
    pcie_rx_kbps: Curve = field(default_factory=lambda: Curve.constant(0))
    sm_clock_mhz: Curve | None = None  # None: idle clock + (max - idle) * gpu_util / 100
    idle_sm_clock_mhz: int = 345
    max_sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    max_mem_clock_mhz: int = 2619
    video_clock_mhz: int = 1755
    performance_state: int = 0
    persistence_mode: bool = True
    display_mode: bool = False
    display_active: bool = False
    ecc_mode: bool = True
    ecc_volatile_uncorrected: int = 0
    ecc_volatile_corrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    ecc_aggregate_corrected: int = 0
    compute_mode: str = "Default"
    mig_mode: bool = False
    max_mig_devices: int = 7
    mig_devices: list[SimMigDevice] = field(default_factory=list)
    architecture: str = "Hopper"
    cuda_compute_capability: tuple[int, int] = (9, 0)
    pcie_link_gen: int = 5
    pcie_max_link_gen: int = 5
    pcie_link_width: int = 16
    pcie_max_link_width: int = 16
    vbios_version: str = "96.00.74.00.0D"
    inforom_image_version: str = "G520.0200.00.05"
    inforom_oem_version: str = "2.1"
    board_id: int = 0  # filled from the index when 0
    multi_gpu_board: bool = False
    minor_number: int = -1  # filled from the index when negative
    slowdown_temp_c: int = 87
    shutdown_temp_c: int = 92
    gpu_max_temp_c: int = 85
    mem_max_temp_c: int = 95
    energy_start_mj: int = 0
    # Per-process utilization samples (nvmlDeviceGetProcessUtilization): the driver records one per
    # process with non-zero utilization every period into a ring buffer of this many periods.
    process_sample_period_s: float = 1.0 / 6.0
    process_sample_buffer: int = 30


@dataclass
class SimProcess:
    pid: int
    gpu_index: int = 0
    type: str = "C"  # "C", "G" or "C+G"
    used_memory: Curve = field(default_factory=lambda: Curve.constant(0))  # bytes
    gpu_instance_id: int | None = None  # MIG only
    compute_instance_id: int | None = None  # MIG only
    sm_util: Curve = field(default_factory=lambda: Curve.constant(0))
    memory_util: Curve = field(default_factory=lambda: Curve.constant(0))


@dataclass
class Faults:
    """What goes wrong.

    - ``library_missing``: the loader cannot find libnvidia-ml (pynvml raises NVMLError_LibraryNotFound).
    - ``init_error``: nvmlInit fails with this NVML error name (e.g. "DRIVER_NOT_LOADED", "NO_PERMISSION").
    - ``old_driver``: the library lacks :data:`OLD_DRIVER_MISSING` (a 470-branch driver);
      ``missing_symbols`` removes further symbols.
    - ``unsupported``: GPU index -> field names (see :data:`FIELDS`) that answer NOT_SUPPORTED.
    - ``lost_after_s``: GPU index -> seconds after install when it falls off the bus (GPU_IS_LOST).
    """

    library_missing: bool = False
    init_error: str | None = None
    old_driver: bool = False
    missing_symbols: tuple[str, ...] = ()
    unsupported: dict[int, tuple[str, ...]] = field(default_factory=dict)
    lost_after_s: dict[int, float] = field(default_factory=dict)

    def all_missing_symbols(self) -> frozenset[str]:
        return frozenset(self.missing_symbols) | (
            frozenset(OLD_DRIVER_MISSING) if self.old_driver else frozenset()
        )
