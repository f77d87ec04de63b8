"""Which GPU a plan is fitted to: the one named, else NVML's first GPU, else the guide's V100."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from anatomy import gpus
from anatomy.plan.settings import Target, check_gpu


@dataclass(frozen=True)
class GpuMemory:
    name: str
    total_bytes: int
    source: str  # "--gpu", "given", "NVML", or "default (...)"


def resolve_gpu(gpu: str | None, gpu_bytes: int | None = None) -> GpuMemory:
    """--gpu NAME or SIZE, an explicit byte count, NVML's first GPU, or the guide's V100 (said so)."""
    check_gpu(gpu, gpu_bytes, Target.CUDA)
    if gpu_bytes is not None:
        return GpuMemory(gpu or "custom", gpu_bytes, "given")
    if gpu:
        total = gpus.gpu_memory_bytes(gpu)
        assert total is not None  # check_gpu vouched for it
        return GpuMemory(gpus.canonical_name(gpu) or gpu, total, "--gpu")
    found = nvml_gpu()
    if found is not None:
        return GpuMemory(found[0], found[1], "NVML")
    return GpuMemory(
        gpus.DEFAULT_GPU, gpus.GPU_MEMORY[gpus.DEFAULT_GPU], "default (the guide's GPU; pass --gpu)"
    )


@functools.lru_cache(maxsize=1)
def nvml_gpu() -> tuple[str, int] | None:
    """Name and total memory of GPU 0 from NVML, or None when there is no driver. Never raises.
    Read once per process: a plan with its technique table resolves the GPU many times."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
    name = name.decode() if isinstance(name, bytes) else str(name)
    return name, total
