"""nvmlDeviceGetProcessUtilization in the simulated library: nvml.h's contract, read through unmodified
pynvml (its two-call wrapper) and through the raw C entry point (the size protocol by hand)."""

from __future__ import annotations

import ctypes
import math

import pynvml
import pytest

from tui.simnvml import Curve, Faults, Scenario, SimGpu, SimMigDevice, SimProcess
from tui.simnvml.scenario import MiB

# pynvml's private ``_nvmlGetFunctionPointer`` (and its symbol cache) is how a client reaches an NVML
# symbol pynvml wraps differently or not at all, as nvitop does: pynvml has no public way to call a raw
# symbol, and the simulator must answer it as the driver would.

PERIOD = 0.5
BUFFER = 4


def box(**faults: object) -> Scenario:
    gpu = SimGpu(process_sample_period_s=PERIOD, process_sample_buffer=BUFFER)
    return Scenario(
        gpus=[gpu, SimGpu(process_sample_period_s=PERIOD, process_sample_buffer=BUFFER)],
        processes=[
            # SM % rises 10 points a second: each sample's value says when it was taken.
            SimProcess(
                pid=31,
                gpu_index=0,
                used_memory=Curve.constant(MiB),
                sm_util=Curve(keyframes=((0.0, 20.0), (100.0, 1020.0)), maximum=100),
                memory_util=Curve.constant(7),
            ),
            SimProcess(pid=32, gpu_index=0, used_memory=Curve.constant(MiB)),  # idle: never sampled
            SimProcess(
                pid=33, gpu_index=0, type="G", used_memory=Curve.constant(MiB), memory_util=Curve.constant(3)
            ),
            SimProcess(pid=40, gpu_index=1, used_memory=Curve.constant(MiB)),
        ],
        faults=Faults(**faults),  # type: ignore[arg-type]
    )


def expected_sm(t: float) -> int:
    return max(0, min(100, round(20.0 + 10.0 * t if t >= 0 else 20.0)))


def test_whole_buffer_oldest_first_one_sample_per_active_process_per_period(simulate, clock):
    lib = simulate(box())
    clock.advance(3.2)  # samples at 1.5, 2.0, 2.5, 3.0 s are in the 4-period buffer
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    times = [1.5, 2.0, 2.5, 3.0]
    expected = []
    for t in times:
        stamp = lib.sample_timestamp_us(t)
        expected.append((31, stamp, expected_sm(t), 7))
        expected.append((33, stamp, 0, 3))
    assert [(s.pid, s.timeStamp, s.smUtil, s.memUtil) for s in samples] == expected
    assert all(s.encUtil == 0 and s.decUtil == 0 for s in samples)


def test_last_seen_returns_only_newer_samples(simulate, clock):
    lib = simulate(box())
    clock.advance(3.2)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    newest = max(s.timeStamp for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0))
    assert newest == lib.sample_timestamp_us(3.0)
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer yet
        pynvml.nvmlDeviceGetProcessUtilization(h, newest)
    clock.advance(0.4)  # 3.6 s: the sample of 3.5 s is new
    fresh = pynvml.nvmlDeviceGetProcessUtilization(h, newest)
    assert [(s.pid, s.timeStamp, s.smUtil) for s in fresh] == [
        (31, lib.sample_timestamp_us(3.5), expected_sm(3.5)),
        (33, lib.sample_timestamp_us(3.5), 0),
    ]
    # A timestamp between two samples: the later ones only.
    middle = (lib.sample_timestamp_us(2.5) + lib.sample_timestamp_us(3.0)) // 2
    assert {s.timeStamp for s in pynvml.nvmlDeviceGetProcessUtilization(h, middle)} == {
        lib.sample_timestamp_us(3.0),
        lib.sample_timestamp_us(3.5),
    }


def test_timestamps_are_cpu_time_in_microseconds(simulate):
    import time

    simulate(box())  # the fake clock has not moved: the newest sample is at most one period old
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    newest = max(s.timeStamp for s in pynvml.nvmlDeviceGetProcessUtilization(h, 0))
    assert abs(newest - time.time() * 1e6) < (PERIOD + 5.0) * 1e6


def test_the_two_call_size_protocol_by_hand(simulate, clock):
    lib = simulate(box())
    clock.advance(10.0)
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    count = ctypes.c_uint(0)
    assert fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(0)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2 * BUFFER
    small = (pynvml.c_nvmlProcessUtilizationSample_t * 3)()
    count = ctypes.c_uint(3)
    assert fn(h, small, ctypes.byref(count), ctypes.c_ulonglong(0)) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 2 * BUFFER and small[0].pid == 0  # nothing written into a short buffer
    big = (pynvml.c_nvmlProcessUtilizationSample_t * 20)()
    count = ctypes.c_uint(20)
    assert fn(h, big, ctypes.byref(count), ctypes.c_ulonglong(0)) == pynvml.NVML_SUCCESS
    assert count.value == 2 * BUFFER
    assert big[count.value].pid == 0  # entries past the count untouched
    assert lib.calls["nvmlDeviceGetProcessUtilization"] == 3


def test_no_sample_is_not_found_and_the_count_is_zero(simulate):
    simulate(box())
    h = pynvml.nvmlDeviceGetHandleByIndex(1)  # its one process is idle
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetProcessUtilization")
    count = ctypes.c_uint(5)
    assert fn(h, None, ctypes.byref(count), ctypes.c_ulonglong(0)) == pynvml.NVML_ERROR_NOT_FOUND
    assert count.value == 0
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetProcessUtilization(h, 0)


def test_not_supported_per_scenario_and_under_mig(simulate):
    scenario = box(unsupported={1: ("process_utilization",)})
    scenario.processes[3].sm_util = Curve.constant(50)
    scenario.gpus.append(
        SimGpu(mig_mode=True, mig_devices=[SimMigDevice(gpu_instance_id=1)], process_sample_period_s=PERIOD)
    )
    scenario.processes.append(
        SimProcess(pid=50, gpu_index=2, gpu_instance_id=1, compute_instance_id=0, sm_util=Curve.constant(9))
    )
    scenario.validate()
    simulate(scenario)
    assert pynvml.nvmlDeviceGetProcessUtilization(pynvml.nvmlDeviceGetHandleByIndex(0), 0)
    for index in (1, 2):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetProcessUtilization(pynvml.nvmlDeviceGetHandleByIndex(index), 0)
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(pynvml.nvmlDeviceGetHandleByIndex(2), 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetProcessUtilization(mig, 0)


def test_sampling_settings_round_trip_and_are_checked(tmp_path):
    scenario = box()
    scenario.to_json(tmp_path / "box.json")
    again = Scenario.from_json(tmp_path / "box.json")
    assert again.gpus[0].process_sample_period_s == PERIOD and again.gpus[0].process_sample_buffer == BUFFER
    from tui.simnvml.curves import ScenarioError

    with pytest.raises(ScenarioError, match="positive period"):
        Scenario(gpus=[SimGpu(process_sample_period_s=0.0)])
    with pytest.raises(ScenarioError, match="positive period"):
        Scenario(gpus=[SimGpu(process_sample_buffer=0)])
    assert math.isclose(SimGpu().process_sample_period_s, 1 / 6)
