"""Unmodified pynvml against the simulated library: every getter answers the scenario's values."""

from __future__ import annotations

import ctypes
import math

import pynvml
import pytest

from tui.simnvml import Curve, Scenario, SimGpu, SimProcess, exported_symbols
from tui.simnvml.scenario import MiB

# pynvml's private ``_nvmlGetFunctionPointer`` is how a client reaches an NVML symbol pynvml wraps
# differently or not at all, as nvitop does: pynvml has no public way to call a raw symbol, and the
# simulator must answer it as the driver would. Its error strings (``NVMLError._errcode_to_string``) and
# ``_nvmlEnableState_t`` have no public name either.

A100 = SimGpu(
    name="NVIDIA A100-SXM4-40GB",
    uuid="GPU-aaaaaaaa-1111-2222-3333-444444444444",
    serial="1324020000001",
    bus_id="00000000:07:00.0",
    pci_device_id=0x20B010DE,
    pci_subsystem_id=0x134F10DE,
    memory_total=40960 * MiB,
    memory_reserved=400 * MiB,
    memory_other_used=100 * MiB,
    bar1_total=65536 * MiB,
    bar1_used=5 * MiB,
    power_limit_w=400.0,
    power_default_limit_w=400.0,
    power_min_limit_w=100.0,
    power_max_limit_w=400.0,
    fan_percent=Curve.constant(44),
    num_fans=2,
    temperature_c=Curve(base=50, amplitude=10, period_s=40),
    power_w=Curve(keyframes=((0.0, 100.0), (10.0, 300.0))),
    gpu_util=Curve.constant(70),
    memory_util=Curve.constant(30),
    encoder_util=Curve.constant(5),
    decoder_util=Curve.constant(7),
    pcie_tx_kbps=Curve.constant(1000),
    pcie_rx_kbps=Curve.constant(2000),
    sm_clock_mhz=Curve.constant(1410),
    max_sm_clock_mhz=1410,
    mem_clock_mhz=1215,
    max_mem_clock_mhz=1215,
    video_clock_mhz=1275,
    performance_state=2,
    persistence_mode=False,
    display_mode=True,
    display_active=False,
    ecc_volatile_uncorrected=3,
    ecc_volatile_corrected=11,
    ecc_aggregate_uncorrected=5,
    ecc_aggregate_corrected=17,
    compute_mode="Exclusive_Process",
    architecture="Ampere",
    cuda_compute_capability=(8, 0),
    pcie_link_gen=3,
    pcie_max_link_gen=4,
    pcie_link_width=8,
    pcie_max_link_width=16,
    vbios_version="92.00.19.00.01",
    inforom_image_version="G506.0202.00.02",
    inforom_oem_version="2.0",
    board_id=0x4300,
    multi_gpu_board=True,
    minor_number=5,
    slowdown_temp_c=88,
    shutdown_temp_c=93,
    gpu_max_temp_c=86,
    mem_max_temp_c=94,
    energy_start_mj=123_456,
)


def two_gpu_box() -> Scenario:
    return Scenario(
        gpus=[A100, SimGpu()],
        processes=[
            SimProcess(pid=4242, gpu_index=0, type="C", used_memory=Curve.constant(1024 * MiB)),
            SimProcess(pid=4243, gpu_index=0, type="G", used_memory=Curve.constant(512 * MiB)),
            SimProcess(pid=4244, gpu_index=0, type="C+G", used_memory=Curve.constant(256 * MiB)),
            SimProcess(pid=5000, gpu_index=1, type="C", used_memory=Curve.constant(2048 * MiB)),
        ],
        driver_version="535.104.05",
        cuda_driver_version=12020,
        nvml_version="12.535.104.05",
    )


def test_system_queries(simulate):
    simulate(two_gpu_box())
    assert pynvml.nvmlSystemGetDriverVersion() == "535.104.05"
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.535.104.05"
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12020
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12020
    assert pynvml.nvmlDeviceGetCount() == 2


def test_identity_of_each_gpu(simulate):
    simulate(two_gpu_box())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-40GB"
    assert pynvml.nvmlDeviceGetUUID(h) == A100.uuid
    assert pynvml.nvmlDeviceGetSerial(h) == "1324020000001"
    assert pynvml.nvmlDeviceGetIndex(h) == 0
    assert pynvml.nvmlDeviceGetMinorNumber(h) == 5
    assert pynvml.nvmlDeviceGetBoardId(h) == 0x4300
    assert pynvml.nvmlDeviceGetMultiGpuBoard(h) == 1
    assert pynvml.nvmlDeviceGetBrand(h) == pynvml.NVML_BRAND_NVIDIA
    assert pynvml.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_AMPERE
    assert pynvml.nvmlDeviceGetCudaComputeCapability(h) == (8, 0)
    assert pynvml.nvmlDeviceGetVbiosVersion(h) == "92.00.19.00.01"
    assert pynvml.nvmlDeviceGetInforomImageVersion(h) == "G506.0202.00.02"
    assert pynvml.nvmlDeviceGetInforomVersion(h, pynvml.NVML_INFOROM_OEM) == "2.0"
    pci = pynvml.nvmlDeviceGetPciInfo_v3(h)
    assert (pci.busId, pci.busIdLegacy) == ("00000000:07:00.0", "0000:07:00.0")
    assert (pci.domain, pci.bus, pci.device) == (0, 7, 0)
    assert (pci.pciDeviceId, pci.pciSubSystemId) == (0x20B010DE, 0x134F10DE)
    ext = pynvml.nvmlPciInfoExt_v1_t()
    ext.version = pynvml.nvmlPciInfoExt_v1
    pynvml.nvmlDeviceGetPciInfoExt(h, ctypes.byref(ext))
    assert (ext.busId, ext.bus, ext.pciDeviceId, ext.baseClass) == ("00000000:07:00.0", 7, 0x20B010DE, 3)

    h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert pynvml.nvmlDeviceGetName(h1) == "NVIDIA H100 80GB HBM3"
    assert pynvml.nvmlDeviceGetIndex(h1) == 1
    assert pynvml.nvmlDeviceGetPciInfo_v3(h1).busId == "00000000:2A:00.0"  # filled in per index
    assert pynvml.nvmlDeviceGetUUID(h1) != A100.uuid


def test_handles_by_uuid_bus_id_and_serial_point_at_the_same_gpu(simulate):
    simulate(two_gpu_box())
    for getter, key in (
        (pynvml.nvmlDeviceGetHandleByUUID, A100.uuid),
        (pynvml.nvmlDeviceGetHandleByPciBusId, "00000000:07:00.0"),
        (pynvml.nvmlDeviceGetHandleByPciBusId, "0000:07:00.0"),
        (pynvml.nvmlDeviceGetHandleBySerial, "1324020000001"),
    ):
        assert pynvml.nvmlDeviceGetIndex(getter(key)) == 0
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(2)


def test_modes_and_ecc(simulate):
    simulate(two_gpu_box())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetPersistenceMode(h) == pynvml.NVML_FEATURE_DISABLED
    assert pynvml.nvmlDeviceGetDisplayMode(h) == pynvml.NVML_FEATURE_ENABLED
    assert pynvml.nvmlDeviceGetDisplayActive(h) == pynvml.NVML_FEATURE_DISABLED
    assert pynvml.nvmlDeviceGetComputeMode(h) == pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS
    assert pynvml.nvmlDeviceGetMigMode(h) == [0, 0]
    assert pynvml.nvmlDeviceGetEccMode(h) == [1, 1]
    ecc = pynvml.nvmlDeviceGetTotalEccErrors
    unc, cor = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    assert ecc(h, unc, pynvml.NVML_VOLATILE_ECC) == 3
    assert ecc(h, cor, pynvml.NVML_VOLATILE_ECC) == 11
    assert ecc(h, unc, pynvml.NVML_AGGREGATE_ECC) == 5
    assert ecc(h, cor, pynvml.NVML_AGGREGATE_ECC) == 17
    assert pynvml.nvmlDeviceGetPersistenceMode(pynvml.nvmlDeviceGetHandleByIndex(1)) == 1


def test_sensors_follow_their_curves(simulate, clock):
    simulate(two_gpu_box())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    seen = []
    for t in (0.0, 10.0, 30.0):
        clock.now = 1000.0 + t
        expected_temp = round(50 + 10 * math.sin(2 * math.pi * t / 40))
        assert pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU) == expected_temp
        assert pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) == expected_temp
        expected_mw = round(1000 * (100 + 200 * min(t, 10.0) / 10))
        assert pynvml.nvmlDeviceGetPowerUsage(h) == expected_mw
        seen.append(expected_temp)
    assert len(set(seen)) == 3  # the values did change over time
    assert pynvml.nvmlDeviceGetFanSpeed(h) == 44
    assert pynvml.nvmlDeviceGetFanSpeed_v2(h, 1) == 44
    assert pynvml.nvmlDeviceGetNumFans(h) == 2
    thresholds = {
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: 93,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: 88,
        pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: 86,
        pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: 94,
    }
    for which, value in thresholds.items():
        assert pynvml.nvmlDeviceGetTemperatureThreshold(h, which) == value
    assert pynvml.nvmlDeviceGetPerformanceState(h) == 2
    assert pynvml.nvmlDeviceGetPowerState(h) == 2


def test_energy_counter_integrates_power(simulate, clock):
    simulate(two_gpu_box())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == 123_456
    clock.advance(10.0)
    # Power ramps linearly 100 W -> 300 W over 10 s: 2000 J = 2,000,000 mJ.
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == pytest.approx(123_456 + 2_000_000, abs=2)
    clock.advance(5.0)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) == pytest.approx(123_456 + 3_500_000, abs=2)


def test_power_limits(simulate):
    simulate(two_gpu_box())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 400_000
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 400_000
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == 400_000
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [100_000, 400_000]
    assert pynvml.nvmlDeviceGetPowerManagementMode(h) == pynvml.NVML_FEATURE_ENABLED
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(pynvml.nvmlDeviceGetHandleByIndex(1)) == 700_000


def test_memory_v2_excludes_reserved_and_v1_includes_it(simulate):
    simulate(two_gpu_box())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    used_by_processes = (1024 + 512 + 256) * MiB  # the C, G and C+G processes on GPU 0
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert v2.version == pynvml.nvmlMemory_v2
    assert v2.total == 40960 * MiB
    assert v2.reserved == 400 * MiB
    assert v2.used == used_by_processes + 100 * MiB
    assert v2.free == v2.total - v2.reserved - v2.used
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    assert v1.total == v2.total
    assert v1.used == v2.used + v2.reserved
    assert v1.free == v2.free
    bar1 = pynvml.nvmlDeviceGetBAR1MemoryInfo(h)
    assert (bar1.bar1Total, bar1.bar1Used, bar1.bar1Free) == (65536 * MiB, 5 * MiB, 65531 * MiB)


def test_processes_by_kind(simulate):
    simulate(two_gpu_box())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    compute = {p.pid: p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    graphics = {p.pid: p for p in pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)}
    assert set(compute) == {4242, 4244}
    assert set(graphics) == {4243, 4244}
    assert compute[4242].usedGpuMemory == 1024 * MiB
    assert graphics[4243].usedGpuMemory == 512 * MiB
    assert compute[4242].gpuInstanceId == 0xFFFFFFFF  # MIG off
    assert compute[4242].computeInstanceId == 0xFFFFFFFF
    assert pynvml.nvmlDeviceGetMPSComputeRunningProcesses(h) == []
    detail = pynvml.nvmlDeviceGetRunningProcessDetailList
    version = pynvml.nvmlProcessDetailList_v1
    compute_detail = {p.pid: p for p in detail(h, version, pynvml.NVML_PROCESS_MODE_COMPUTE)}
    assert {pid: p.usedGpuMemory for pid, p in compute_detail.items()} == {4242: 1024 * MiB, 4244: 256 * MiB}
    assert compute_detail[4242].gpuInstanceId == 0xFFFFFFFF
    assert [p.pid for p in detail(h, version, pynvml.NVML_PROCESS_MODE_GRAPHICS)] == [4243, 4244]
    assert detail(h, version, pynvml.NVML_PROCESS_MODE_MPS) == []
    other = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(1))
    assert [(p.pid, p.usedGpuMemory) for p in other] == [(5000, 2048 * MiB)]
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(1)) == []


def test_utilization_clocks_and_pcie(simulate):
    simulate(two_gpu_box())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    util = pynvml.nvmlDeviceGetUtilizationRates(h)
    assert (util.gpu, util.memory) == (70, 30)
    assert pynvml.nvmlDeviceGetEncoderUtilization(h)[0] == 5
    assert pynvml.nvmlDeviceGetDecoderUtilization(h)[0] == 7
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1410
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == 1215
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS) == 1410
    assert pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_VIDEO) == 1275
    assert pynvml.nvmlDeviceGetClock(h, pynvml.NVML_CLOCK_MEM, pynvml.NVML_CLOCK_ID_CURRENT) == 1215
    idle = pynvml.nvmlDeviceGetHandleByIndex(1)  # 0% busy: idle clock, and the idle event reason
    assert pynvml.nvmlDeviceGetClockInfo(idle, pynvml.NVML_CLOCK_SM) == SimGpu().idle_sm_clock_mhz
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(idle) & pynvml.nvmlClocksEventReasonGpuIdle
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonGpuIdle == 0
    assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES) == 1000
    assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES) == 2000
    assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == 3
    assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h) == 4
    assert pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == 4
    assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == 8
    assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(h) == 16


def test_process_utilization_samples(simulate):
    box = two_gpu_box()
    box.processes[0].sm_util = Curve.constant(61)
    box.processes[0].memory_util = Curve.constant(23)
    box.processes[2].sm_util = Curve.constant(5)
    simulate(box)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    samples = {s.pid: s for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0)}
    assert set(samples) == {4242, 4244}  # 4243 had no utilization: the driver lists no sample for it
    assert (samples[4242].smUtil, samples[4242].memUtil) == (61, 23)
    assert (samples[4244].smUtil, samples[4244].memUtil) == (5, 0)
    assert samples[4242].timeStamp > 0


def test_error_strings_and_call_counting(simulate):
    lib = simulate(two_gpu_box())
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)) == "Not Supported"
    before = lib.total_calls
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for _ in range(3):
        pynvml.nvmlDeviceGetName(h)
    assert lib.calls["nvmlDeviceGetName"] == 3
    assert lib.calls["nvmlDeviceGetHandleByIndex_v2"] == 1
    assert lib.total_calls == before + 4


def test_layouts_agree_with_pynvml_structs():
    from tui.simnvml import abi

    pairs = [
        (abi.PciInfo, pynvml.nvmlPciInfo_t),
        (abi.PciInfoV1, pynvml.nvmlPciInfo_v2_t),
        (abi.PciInfoExtV1, pynvml.nvmlPciInfoExt_v1_t),
        (abi.MemoryV1, pynvml.c_nvmlMemory_t),
        (abi.MemoryV2, pynvml.c_nvmlMemory_v2_t),
        (abi.Bar1Memory, pynvml.c_nvmlBAR1Memory_t),
        (abi.Utilization, pynvml.c_nvmlUtilization_t),
        (abi.ProcessInfoV2, pynvml.c_nvmlProcessInfo_v3_t),
        (abi.ProcessDetailV1, pynvml.c_nvmlProcessDetail_v1_t),
        (abi.ProcessDetailListV1, pynvml.c_nvmlProcessDetailList_v1_t),
        (abi.TemperatureV1, pynvml.c_nvmlTemperature_v1_t),
        (abi.ProcessUtilizationSample, pynvml.c_nvmlProcessUtilizationSample_t),
        (abi.FieldValue, pynvml.c_nvmlFieldValue_t),
    ]
    for ours, theirs in pairs:
        assert ctypes.sizeof(ours) == ctypes.sizeof(theirs), ours.__name__
        for (name, _type), (their_name, _their_type) in zip(ours._fields_, theirs._fields_, strict=True):
            assert getattr(ours, name).offset == getattr(theirs, their_name).offset, (ours.__name__, name)
    assert abi.MEMORY_V2_VERSION == pynvml.nvmlMemory_v2 == 0x02000028
    assert abi.TEMPERATURE_V1_VERSION == pynvml.nvmlTemperature_v1 == 0x0100000C
    assert pynvml.nvmlPciInfoExt_v1 == abi.PCI_INFO_EXT_V1_VERSION
    assert pynvml.nvmlFanSpeedInfo_v1 == abi.FAN_SPEED_INFO_V1_VERSION
    assert pynvml.nvmlProcessDetailList_v1 == abi.PROCESS_DETAIL_LIST_V1_VERSION


def test_return_codes_agree_with_pynvml():
    from tui.simnvml.abi import ERROR_STRINGS, Return

    for member in Return:
        assert (
            getattr(pynvml, "NVML_SUCCESS" if member.name == "SUCCESS" else f"NVML_ERROR_{member.name}")
            == member
        )
    for code, text in pynvml.NVMLError._errcode_to_string.items():
        assert ERROR_STRINGS[code] == text


def _call_v1(name: str, handle: object, *args: object) -> int:
    return pynvml._nvmlGetFunctionPointer(name)(handle, *args)


def test_every_exported_symbol_is_exercised(simulate):
    """Drive each symbol once (older entry points by hand, as a caller of an old binding would)."""
    lib = simulate(two_gpu_box())
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    for name in ("nvmlInit_v2", "nvmlInit"):
        assert pynvml._nvmlGetFunctionPointer(name)() == pynvml.NVML_SUCCESS
        assert pynvml._nvmlGetFunctionPointer("nvmlShutdown")() == pynvml.NVML_SUCCESS
    count = ctypes.c_uint()
    assert pynvml._nvmlGetFunctionPointer("nvmlDeviceGetCount")(ctypes.byref(count)) == 0 and count.value == 2
    handle = pynvml.c_nvmlDevice_t()
    assert pynvml._nvmlGetFunctionPointer("nvmlDeviceGetHandleByIndex")(1, ctypes.byref(handle)) == 0
    assert pynvml.nvmlDeviceGetIndex(handle) == 1
    assert (
        pynvml._nvmlGetFunctionPointer("nvmlDeviceGetHandleByPciBusId")(b"0000:07:00.0", ctypes.byref(handle))
        == 0
    )
    assert pynvml.nvmlDeviceGetIndex(handle) == 0
    for name in ("nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo"):
        old_pci = pynvml.nvmlPciInfo_v2_t()  # the pre-v3 layout: 16-byte busId
        assert _call_v1(name, h, ctypes.byref(old_pci)) == 0
        assert (old_pci.busId, old_pci.bus, old_pci.pciDeviceId) == ("0000:07:00.0", 7, 0x20B010DE)
    from tui.simnvml.abi import ProcessInfoV1

    for name, pids in (
        ("nvmlDeviceGetComputeRunningProcesses", {4242, 4244}),
        ("nvmlDeviceGetGraphicsRunningProcesses", {4243, 4244}),
        ("nvmlDeviceGetMPSComputeRunningProcesses", set()),
    ):
        n = ctypes.c_uint(8)
        buf = (ProcessInfoV1 * 8)()
        assert _call_v1(name, h, ctypes.byref(n), buf) == 0
        assert {buf[i].pid for i in range(n.value)} == pids
    for name in ("nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses_v2"):
        n = ctypes.c_uint(0)
        assert _call_v1(name, h, ctypes.byref(n), None) in (
            pynvml.NVML_SUCCESS,
            pynvml.NVML_ERROR_INSUFFICIENT_SIZE,
        )
    assert pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0
    current, pending = pynvml._nvmlEnableState_t(), pynvml._nvmlEnableState_t()
    assert _call_v1("nvmlDeviceGetDriverModel", h, ctypes.byref(current), ctypes.byref(pending)) == 3
    with pytest.raises(pynvml.NVMLError_NotSupported):  # Windows-only
        pynvml.nvmlDeviceGetDriverModel_v2(h)
    values = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_POWER_INSTANT])
    assert values[0].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert pynvml.nvmlSystemGetProcessName(__import__("os").getpid())
    # MIG entry points on a GPU without MIG
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    assert pynvml.nvmlDeviceIsMigDeviceHandle(h).value == 0
    for call in (
        lambda: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 0),
        lambda: pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h),
        lambda: pynvml.nvmlDeviceGetGpuInstanceId(h),
        lambda: pynvml.nvmlDeviceGetComputeInstanceId(h),
    ):
        with pytest.raises(pynvml.NVMLError):
            call()

    # The other test functions cover the rest; re-run them here so one test sees every symbol.
    for test in (
        test_system_queries, test_identity_of_each_gpu,
        test_handles_by_uuid_bus_id_and_serial_point_at_the_same_gpu,
        test_modes_and_ecc, test_power_limits, test_memory_v2_excludes_reserved_and_v1_includes_it,
        test_processes_by_kind, test_utilization_clocks_and_pcie,
    ):  # fmt: skip
        test(lambda box: lib)
    pynvml.nvmlDeviceGetFanSpeed(h), pynvml.nvmlDeviceGetFanSpeed_v2(h, 0), pynvml.nvmlDeviceGetNumFans(h)
    pynvml.nvmlDeviceGetTemperature(h, 0), pynvml.nvmlDeviceGetTemperatureV(h, 0)
    pynvml.nvmlDeviceGetTemperatureThreshold(h, 0), pynvml.nvmlDeviceGetPerformanceState(h)
    pynvml.nvmlDeviceGetPowerState(h), pynvml.nvmlDeviceGetPowerUsage(h)
    pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    with pytest.raises(pynvml.NVMLError_NotFound):  # the box's processes are idle: no samples
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    pynvml.nvmlErrorString(pynvml.NVML_ERROR_UNKNOWN)

    never_called = exported_symbols() - set(lib.calls)
    assert never_called == set()
    assert lib.errors == []
