"""NVML's process lists and per-process utilization samples, read straight into ctypes buffers: one call
per list with a buffer sized from the last refresh (NVML's two-call size protocol only when a list grew),
and samples decoded in bulk with ``struct`` rather than field by field through pynvml's classes.
"""

from __future__ import annotations

import ctypes
import struct as struct_module
from collections.abc import Callable

from tui.sources.model import GpuProcess
from tui.sources.nvml_reading import DeviceState

# typing is not imported at run time (~3 ms of --once start-up); the names are for type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

NOT_AVAILABLE_U32 = 0xFFFFFFFF
NOT_AVAILABLE_U64 = 0xFFFFFFFFFFFFFFFF
# One entry of a process list: (pid, used bytes or None, GPU instance id, compute instance id).
ProcessEntry = tuple[int, "int | None", "int | None", "int | None"]


class ProcessInfoV1(ctypes.Structure):
    # The pre-MIG layout (drivers before the _v2 process calls): 16 bytes, no instance ids.
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessUtilizationSample(ctypes.Structure):
    # nvmlProcessUtilizationSample_t. Decoded in bulk with struct (a refresh reads ~6 samples per busy
    # process); pynvml's own struct class answers each field access through a Python __getattribute__.
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


SAMPLE_FORMAT = "@IQIIII"  # the same layout, native alignment (the padding after pid included)


def read_utilization_samples(
    pynvml: Any, dev: DeviceState, since_s: float, count_call: Callable[[], None]
) -> dict[int, tuple[int, int]]:
    """pid -> (smUtil, memUtil) of its newest sample since ``since_s`` (the driver's clock, seconds since
    the epoch); ``count_call`` counts each extra NVML call. One call with a buffer sized
    from the last answer; NVML's size protocol only when the list grew."""
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    struct = ProcessUtilizationSample
    since = ctypes.c_ulonglong(max(0, int(since_s * 1_000_000)))
    capacity = dev.util_capacity * 2 + 8
    for attempt in range(4):
        if attempt:
            count_call()
        buffer = (struct * capacity)()
        count = ctypes.c_uint(capacity)
        ret = fn(dev.handle, buffer, ctypes.byref(count), since)
        if ret == pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            capacity = count.value * 2 + 8  # samples taken between the calls
            continue
        pynvml._nvmlCheckReturn(ret)
        n = min(count.value, capacity)
        dev.util_capacity = n
        latest: dict[int, tuple[int, int, int]] = {}
        raw = memoryview(buffer).cast("B")[: n * ctypes.sizeof(struct)]
        for pid, stamp, sm, mem, _enc, _dec in struct_module.iter_unpack(SAMPLE_FORMAT, raw):
            # A process may have a sample per sampling period: keep its newest.
            if stamp >= latest.get(pid, (-1, 0, 0))[0]:
                latest[pid] = (stamp, min(100, sm), min(100, mem))
        return {pid: (sm, mem) for pid, (_stamp, sm, mem) in latest.items()}
    raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)


def read_process_list(
    pynvml: Any, dev: DeviceState, symbol: str, struct: type[ctypes.Structure], count_call: Callable[[], None]
) -> list[ProcessEntry]:
    """(pid, used bytes, GPU instance, compute instance) per entry of ``symbol``'s list. One call with a
    buffer sized from the last refresh; the size protocol only when it grew."""
    fn = pynvml._nvmlGetFunctionPointer(symbol)
    capacity = dev.proc_capacity.get(symbol, 0) * 2 + 8
    for attempt in range(4):
        if attempt:
            count_call()
        buffer = (struct * capacity)()
        count = ctypes.c_uint(capacity)
        ret = fn(dev.handle, ctypes.byref(count), buffer)
        if ret == pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
            capacity = count.value * 2 + 8  # processes started between the calls
            continue
        pynvml._nvmlCheckReturn(ret)
        n = min(count.value, capacity)
        dev.proc_capacity[symbol] = n
        out: list[ProcessEntry] = []
        for entry in buffer[:n]:
            used = int(entry.usedGpuMemory)
            gi = getattr(entry, "gpuInstanceId", None)
            ci = getattr(entry, "computeInstanceId", None)
            out.append((int(entry.pid), None if used == NOT_AVAILABLE_U64 else used, gi, ci))
        return out
    raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)


def gpu_processes(
    index: int,
    compute: list[ProcessEntry],
    graphics: list[ProcessEntry],
    mig: bool,
    latest: dict[int, tuple[int, int]] | None,
) -> tuple[GpuProcess, ...]:
    """GPU ``index``'s processes from its compute and graphics lists: one per (PID, MIG instance), typed
    "C", "G" or "C+G"; ``latest``: the utilization samples (a PID without one was idle), None: N/A."""
    merged: dict[tuple[int, int | None, int | None], dict[str, Any]] = {}
    for kind, entries in (("C", compute), ("G", graphics)):
        for pid, used, gi, ci in entries:
            gi_id = gi if mig and gi is not None and gi != NOT_AVAILABLE_U32 else None
            ci_id = ci if mig and ci is not None and ci != NOT_AVAILABLE_U32 else None
            key = (pid, gi_id, ci_id)
            row = merged.get(key)
            if row is None:
                merged[key] = {"type": kind, "mem": used, "gi": gi_id, "ci": ci_id}
            else:
                row["type"] = "C+G" if row["type"] != kind else kind
                if row["mem"] is None:
                    row["mem"] = used
    idle = (0, 0) if latest is not None else (None, None)
    procs = []
    for (pid, _gi, _ci), row in merged.items():
        sm, bandwidth = latest.get(pid, idle) if latest is not None else idle
        procs.append(
            GpuProcess(
                gpu_index=index,
                pid=pid,
                type=row["type"],
                gpu_memory=row["mem"],
                gpu_instance_id=row["gi"],
                compute_instance_id=row["ci"],
                sm_util=sm,
                memory_bw_util=bandwidth,
            )
        )
    return tuple(procs)
