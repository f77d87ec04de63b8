"""Faults: version mismatches, old drivers, unsupported fields, lost GPUs, failed init, no library."""

from __future__ import annotations

import ctypes

import pynvml
import pytest

from tui.simnvml import OLD_DRIVER_MISSING, Curve, Faults, Scenario, SimGpu, install, installed, uninstall

# pynvml's private ``_nvmlGetFunctionPointer`` (and its symbol cache) is how a client reaches an NVML
# symbol pynvml wraps differently or not at all, as nvitop does: pynvml has no public way to call a raw
# symbol, and the simulator must answer it as the driver would.


def test_wrong_struct_version_is_an_argument_version_mismatch(simulate):
    simulate(Scenario.build(1))
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    wrong_memory = (ctypes.sizeof(pynvml.c_nvmlMemory_v2_t)) | (1 << 24)
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(h, version=wrong_memory)
    temp = pynvml.c_nvmlTemperature_v1_t()
    temp.version = pynvml.nvmlTemperature_v1 + 1
    ret = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetTemperatureV")(h, ctypes.byref(temp))
    assert ret == pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH == 25
    ext = pynvml.nvmlPciInfoExt_v1_t()
    ext.version = 0
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetPciInfoExt(h, ctypes.byref(ext))
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetRunningProcessDetailList(h, pynvml.nvmlProcessDetailList_v1 + 8, 0)
    # the right versions still work
    assert pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2).total == SimGpu().memory_total
    temp.version = pynvml.nvmlTemperature_v1
    assert pynvml._nvmlGetFunctionPointer("nvmlDeviceGetTemperatureV")(h, ctypes.byref(temp)) == 0


def test_old_driver_lacks_newer_symbols_and_the_older_calls_work(simulate):
    box = Scenario.build(1, 3, faults=Faults(old_driver=True))
    lib = simulate(box)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h)
    # pynvml 13's unversioned wrapper turns that miss into an exception outside the NVMLError family
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h)] == [100_000, 100_001, 100_002]
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    gpu = box.gpus[0]
    assert v1.used == sum(int(p.used_memory.at(0)) for p in box.processes) + gpu.memory_reserved
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetTemperatureV(h, 0)
    assert pynvml.nvmlDeviceGetTemperature(h, 0) == 35
    # misses are not cached by pynvml, and the simulator logs each lookup
    assert "nvmlDeviceGetTemperatureV" not in pynvml._nvmlGetFunctionPointer_cache
    assert lib.missing["nvmlDeviceGetComputeRunningProcesses_v3"] == 2
    assert lib.unimplemented == set()  # they exist in newer drivers: not simulator gaps
    assert set(OLD_DRIVER_MISSING) >= {"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV"}


def test_missing_init_with_flags_and_count_v2_fall_back_to_older_entry_points(simulate):
    faults = Faults(missing_symbols=("nvmlInitWithFlags", "nvmlDeviceGetCount_v2"))
    simulate(Scenario.build(3, faults=faults), init=False)
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlInit()
    assert pynvml._nvmlGetFunctionPointer("nvmlInit_v2")() == pynvml.NVML_SUCCESS
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetCount()
    count = ctypes.c_uint()
    assert pynvml._nvmlGetFunctionPointer("nvmlDeviceGetCount")(ctypes.byref(count)) == 0
    assert count.value == 3


def test_unsupported_fields_read_as_not_supported_on_that_gpu_only(simulate):
    faults = Faults(unsupported={0: ("temperature", "power_usage", "ecc", "utilization", "processes")})
    simulate(Scenario.build(2, 2, faults=faults))
    h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    calls = [
        lambda h: pynvml.nvmlDeviceGetTemperature(h, 0),
        lambda h: pynvml.nvmlDeviceGetTemperatureV(h, 0),
        pynvml.nvmlDeviceGetPowerUsage,
        lambda h: pynvml.nvmlDeviceGetTotalEccErrors(h, 1, 0),
        pynvml.nvmlDeviceGetEccMode,
        pynvml.nvmlDeviceGetUtilizationRates,
        pynvml.nvmlDeviceGetComputeRunningProcesses,
    ]
    for call in calls:
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(h0)
        call(h1)  # the same query on the other GPU answers
    assert pynvml.nvmlDeviceGetName(h0) == SimGpu().name


def test_no_fan_is_not_supported():
    box = Scenario.build(1, gpu=SimGpu(fan_percent=None))
    install(box)
    try:
        pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetFanSpeed(pynvml.nvmlDeviceGetHandleByIndex(0))
    finally:
        uninstall()


def test_gpu_falls_off_the_bus_after_n_seconds(simulate, clock):
    simulate(Scenario.build(2, 4, faults=Faults(lost_after_s={1: 5.0})))
    h0, h1 = pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlDeviceGetHandleByIndex(1)
    clock.advance(4.9)
    assert pynvml.nvmlDeviceGetName(h1) == SimGpu().name
    assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(h1)) == 2
    clock.advance(0.1)
    for call in (
        pynvml.nvmlDeviceGetName,
        pynvml.nvmlDeviceGetUUID,
        pynvml.nvmlDeviceGetMemoryInfo,
        pynvml.nvmlDeviceGetComputeRunningProcesses,
        pynvml.nvmlDeviceGetUtilizationRates,
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(h1)
    assert pynvml.nvmlDeviceGetName(h0) == SimGpu().name  # the other GPU is fine
    assert pynvml.nvmlDeviceGetCount() == 2
    clock.advance(100)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # and it stays lost
        pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(1))


@pytest.mark.parametrize(
    ("error", "exception"),
    [
        ("DRIVER_NOT_LOADED", pynvml.NVMLError_DriverNotLoaded),
        ("NO_PERMISSION", pynvml.NVMLError_NoPermission),
        ("LIB_RM_VERSION_MISMATCH", pynvml.NVMLError_LibRmVersionMismatch),
    ],
)
def test_init_failure(simulate, error, exception):
    simulate(Scenario.build(2, faults=Faults(init_error=error)), init=False)
    with pytest.raises(exception):
        pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_library_not_found_and_uninstall_restores_the_loader():
    real_cdll = pynvml.CDLL
    install(Scenario.build(1), library_missing=True)
    try:
        assert pynvml.nvmlLib is None
        with pytest.raises(pynvml.NVMLError_LibraryNotFound):
            pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError_LibraryNotFound):  # every retry fails the same way
            pynvml.nvmlInit()
        assert pynvml.CDLL("libc.so.6") is not None  # other libraries still load
    finally:
        uninstall()
    assert pynvml.CDLL is real_cdll
    assert pynvml.nvmlLib is None and installed() is None
    # the scenario's own flag does the same
    install(Scenario.build(1, faults=Faults(library_missing=True)))
    try:
        with pytest.raises(pynvml.NVMLError_LibraryNotFound):
            pynvml.nvmlInit()
    finally:
        uninstall()


def test_calls_before_init_are_uninitialized(simulate):
    lib = simulate(Scenario.build(1), init=False)
    assert pynvml.nvmlLib is lib and pynvml._nvmlGetFunctionPointer_cache == {}
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 1  # still one reference
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_reinstall_replaces_the_box_and_clears_the_symbol_cache(simulate):
    simulate(Scenario.build(2))
    assert pynvml.nvmlDeviceGetCount() == 2
    assert "nvmlDeviceGetCount_v2" in pynvml._nvmlGetFunctionPointer_cache
    simulate(Scenario.build(5))
    assert pynvml.nvmlDeviceGetCount() == 5


@pytest.mark.parametrize("n", [0, 1, 8, 16])
def test_gpu_counts(simulate, n):
    simulate(Scenario.build(n, gpu=SimGpu(temperature_c=Curve.constant(41))))
    assert pynvml.nvmlDeviceGetCount() == n
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
    assert [pynvml.nvmlDeviceGetIndex(h) for h in handles] == list(range(n))
    assert len({pynvml.nvmlDeviceGetUUID(h) for h in handles}) == n
    assert len({pynvml.nvmlDeviceGetPciInfo_v3(h).busId for h in handles}) == n
    assert all(pynvml.nvmlDeviceGetTemperature(h, 0) == 41 for h in handles)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(n)


def test_a_bad_handle_is_an_invalid_argument(simulate):
    simulate(Scenario.build(1))
    bogus = ctypes.cast(ctypes.c_void_p(0x1234), pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(bogus)


def test_a_simulator_bug_is_an_unknown_error_not_a_crash(simulate, capfd):
    box = Scenario.build(1)
    lib = simulate(box)
    box.gpus[0].temperature_c = "hot"  # type: ignore[assignment]  # breaks the curve evaluation
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetTemperature(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    assert len(lib.errors) == 1 and lib.errors[0].startswith("nvmlDeviceGetTemperature:")
    assert "Traceback" not in capfd.readouterr().err


def test_call_counts_are_exact_across_threads(simulate):
    import threading

    lib = simulate(Scenario.build(2))
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)

    def work() -> None:
        for _ in range(500):
            pynvml.nvmlDeviceGetUtilizationRates(handle)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert lib.calls["nvmlDeviceGetUtilizationRates"] == 2000
