"""Hand-built MachineSnapshots for the report tests (no NVML needed)."""

from __future__ import annotations

from tui.sources.model import GpuInfo, GpuProcess, HostInfo, MachineSnapshot, NvmlStatus

MiB = 1 << 20
GiB = 1 << 30

STATUS = NvmlStatus(
    available=True, driver_version="550.54.15", cuda_driver_version="12.4", nvml_version="12.550"
)
HOST = HostInfo(
    cpu_percent=12.5,
    cpu_count=64,
    memory_total=512 * GiB,
    memory_used=100 * GiB,
    memory_available=412 * GiB,
    swap_total=0,
    swap_used=0,
    load_avg=(1.5, 1.25, 1.0),
    hostname="node-17",
)


def full_gpu(index: int = 0) -> GpuInfo:
    return GpuInfo(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        persistence_mode=True,
        bus_id=f"00000000:{0x18 + index:02X}:00.0",
        display_active=False,
        ecc_volatile_uncorrected=3,
        fan_percent=41,
        temperature_c=63,
        performance_state=0,
        power_w=540.4,
        power_limit_w=700.0,
        memory_total=81559 * MiB,
        memory_used=71000 * MiB + 123,
        memory_free=10559 * MiB - 123,
        memory_reserved=528 * MiB,
        gpu_util=88,
        memory_util=41,
        compute_mode="Exclusive_Process",
        mig_mode=False,
    )


def bare_gpu(index: int = 1) -> GpuInfo:
    """Every optional field N/A (a GPU that supports nothing)."""
    return GpuInfo(index=index)


def snapshot(
    gpus: tuple[GpuInfo, ...] = (), processes: tuple[GpuProcess, ...] = (), status: NvmlStatus = STATUS
) -> MachineSnapshot:
    return MachineSnapshot(time=1_763_768_882.0, nvml=status, gpus=gpus, processes=processes, host=HOST)
