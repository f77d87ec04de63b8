"""Process lists (two-call size protocol, MIG ids) and the real local processes behind them."""

from __future__ import annotations

import ctypes
import os

import psutil
import pynvml
import pytest

from tui.simnvml import Curve, Scenario, SimGpu, SimMigDevice, SimProcess
from tui.simnvml.processes import exited_pid, sleepers, spawn_sleepers, stop_sleepers
from tui.simnvml.scenario import GiB, MiB

# pynvml's private ``_nvmlGetFunctionPointer`` (and its symbol cache) is how a client reaches an NVML
# symbol pynvml wraps differently or not at all, as nvitop does: pynvml has no public way to call a raw
# symbol, and the simulator must answer it as the driver would.


def test_64_processes_come_back_through_the_two_call_protocol(simulate):
    box = Scenario.build(1, 64, process_memory=GiB)
    simulate(box)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    got = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in got] == [(100_000 + k, GiB + k * MiB) for k in range(64)]

    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    count = ctypes.c_uint(0)
    assert fn(h, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 64
    small = (pynvml.c_nvmlProcessInfo_v3_t * 10)()
    count.value = 10
    assert fn(h, ctypes.byref(count), small) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 64
    assert small[0].pid == 0  # nothing written into a buffer that is too small
    exact = (pynvml.c_nvmlProcessInfo_v3_t * 64)()
    assert fn(h, ctypes.byref(count), exact) == pynvml.NVML_SUCCESS
    assert count.value == 64 and exact[63].pid == 100_063


def test_processes_spread_over_eight_gpus(simulate):
    simulate(Scenario.build(8, 64))
    for i in range(8):
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))
        assert [p.pid for p in procs] == [100_000 + k for k in range(i, 64, 8)]


def test_an_idle_gpu_has_an_empty_list(simulate):
    simulate(Scenario.build(2, 1))
    h = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    with pytest.raises(pynvml.NVMLError_NotFound):  # no utilization samples either
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)


def mig_box() -> Scenario:
    gpu = SimGpu(
        mig_mode=True,
        mig_devices=[
            SimMigDevice(
                gpu_instance_id=1, compute_instance_id=0, profile="3g.40gb", memory_total=40192 * MiB
            ),
            SimMigDevice(
                gpu_instance_id=2, compute_instance_id=0, profile="1g.10gb", memory_total=9856 * MiB
            ),
        ],
    )
    return Scenario(
        gpus=[gpu],
        processes=[
            SimProcess(
                pid=7001,
                gpu_index=0,
                used_memory=Curve.constant(3 * GiB),
                gpu_instance_id=1,
                compute_instance_id=0,
            ),
            SimProcess(
                pid=7002,
                gpu_index=0,
                used_memory=Curve.constant(1 * GiB),
                gpu_instance_id=2,
                compute_instance_id=0,
            ),
        ],
    )


def test_mig_instance_ids_and_mig_device_handles(simulate):
    simulate(mig_box())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    ids = {
        p.pid: (p.gpuInstanceId, p.computeInstanceId) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    }
    assert ids == {7001: (1, 0), 7002: (2, 0)}
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no whole-GPU utilization under MIG
        pynvml.nvmlDeviceGetUtilizationRates(h)

    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 1)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    assert pynvml.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    assert pynvml.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert pynvml.nvmlDeviceGetGpuInstanceId(mig) == 2
    assert pynvml.nvmlDeviceGetComputeInstanceId(mig) == 0
    memory = pynvml.nvmlDeviceGetMemoryInfo(mig, version=pynvml.nvmlMemory_v2)
    assert (memory.total, memory.used) == (9856 * MiB, 1 * GiB)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)] == [7002]
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)
    assert pynvml.nvmlDeviceGetUUID(parent) == pynvml.nvmlDeviceGetUUID(h)
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(mig))
    assert pynvml.nvmlDeviceGetGpuInstanceId(by_uuid) == 2
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 2)


def test_sleepers_look_like_training_processes():
    procs = spawn_sleepers(
        3, names=["python train.py --rank 0", "torchrun train.py --nproc 8", "python x.py"]
    )
    try:
        cmdlines = [psutil.Process(p.pid).cmdline() for p in procs]
        assert cmdlines == [
            ["python", "train.py", "--rank", "0"],
            ["torchrun", "train.py", "--nproc", "8"],
            ["python", "x.py"],
        ]
        assert [psutil.Process(p.pid).name() for p in procs] == ["python", "torchrun", "python"]
        assert all(psutil.Process(p.pid).children() == [] for p in procs)  # one process each
    finally:
        stop_sleepers(procs)
    assert all(not psutil.pid_exists(p.pid) for p in procs)


def test_sleepers_context_manager_and_an_exited_pid():
    with sleepers(2) as pids:
        assert all(psutil.pid_exists(pid) for pid in pids)
    assert not any(psutil.pid_exists(pid) for pid in pids)
    gone = exited_pid()
    assert gone > 0 and not os.path.exists(f"/proc/{gone}")
    with pytest.raises(ValueError):
        spawn_sleepers(1, names=["python -u train.py"])
