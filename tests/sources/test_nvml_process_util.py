"""Per-process SM % and memory-bandwidth % in the NVML source, through unmodified pynvml against the
simulated library: the newest sample per process, 0 for a process the driver did not sample, N/A where
the GPU does not sample (scenario fault, MIG), the size protocol and lastSeenTimeStamp across refreshes."""

from __future__ import annotations

import math
from typing import Any

from tui.simnvml import Curve, Faults, Scenario, SimGpu, SimMigDevice, SimProcess
from tui.sources.machine import MachineSource
from tui.sources.nvml import NvmlSource

MiB = 1 << 20
PERIOD = 0.25


def percent(value: float) -> int:
    return max(0, min(100, round(value)))


def newest_sample_time(t: float) -> float:
    return math.floor(t / PERIOD) * PERIOD


def gpu(buffer: int = 20, **kwargs: Any) -> SimGpu:
    return SimGpu(process_sample_period_s=PERIOD, process_sample_buffer=buffer, **kwargs)


def busy(pid: int, gpu_index: int, sm: Curve, mem: Curve) -> SimProcess:
    return SimProcess(
        pid=pid, gpu_index=gpu_index, used_memory=Curve.constant(MiB), sm_util=sm, memory_util=mem
    )


def driver_time(lib: Any) -> Any:
    """The simulated driver's CPU time (what it stamps samples with) as the source's wall clock."""
    return lambda: lib.sample_timestamp_us(lib.elapsed()) / 1e6


def by_pid(reading: Any) -> dict[int, tuple[int | None, int | None]]:
    return {p.pid: (p.sm_util, p.memory_bw_util) for p in reading.processes}


def test_each_process_gets_its_newest_sample(sim: Any, clock: Any) -> None:
    sm = [Curve(base=60, amplitude=30, period_s=7, phase_s=k, minimum=0, maximum=100) for k in range(3)]
    mem = [Curve(base=30, amplitude=20, period_s=5, phase_s=2 * k, minimum=0, maximum=100) for k in range(3)]
    scenario = Scenario(
        gpus=[gpu(), gpu()],
        processes=[
            busy(11, 0, sm[0], mem[0]),
            busy(12, 0, sm[1], mem[1]),
            busy(21, 1, sm[2], mem[2]),
            SimProcess(pid=13, gpu_index=0, used_memory=Curve.constant(MiB)),  # idle: no samples
        ],
    )
    lib = sim(scenario)
    with NvmlSource(clock=clock, wall_clock=driver_time(lib)) as source:
        for now in (0.0, 0.6, 3.1, 3.2, 9.9):
            clock.now = now
            t = newest_sample_time(now)
            expected = {
                11: (percent(sm[0].at(t)), percent(mem[0].at(t))),
                12: (percent(sm[1].at(t)), percent(mem[1].at(t))),
                21: (percent(sm[2].at(t)), percent(mem[2].at(t))),
                13: (0, 0),
            }
            assert by_pid(source.query()) == expected, now


def test_a_refresh_faster_than_sampling_keeps_the_value_and_an_idle_process_drops_to_zero(
    sim: Any, clock: Any
) -> None:
    # Busy at 70 % until t = 5 s, then idle.
    stops = Curve(keyframes=((0.0, 70.0), (5.0, 70.0), (5.001, 0.0)))
    lib = sim(Scenario(gpus=[gpu()], processes=[busy(7, 0, stops, Curve.constant(20))]))
    with NvmlSource(clock=clock, wall_clock=driver_time(lib)) as source:
        clock.now = 4.0
        assert by_pid(source.query()) == {7: (70, 20)}
        for _ in range(3):  # faster than the 0.25 s sampling period: nothing new each time
            clock.advance(0.05)
            assert by_pid(source.query()) == {7: (70, 20)}
        clock.now = 5.1  # the last busy sample (5.0 s) is still the newest
        assert by_pid(source.query()) == {7: (70, 20)}
        clock.now = 7.1  # idle for two seconds: no SM sample in the window
        assert by_pid(source.query()) == {7: (0, 20)}  # memory traffic alone keeps it in the samples
    clock.now = 0.0  # the second box's curves start at install
    lib = sim(Scenario(gpus=[gpu()], processes=[busy(8, 0, stops, stops)]))
    with NvmlSource(clock=clock, wall_clock=driver_time(lib)) as source:
        clock.now = 4.0
        assert by_pid(source.query()) == {8: (70, 70)}
        clock.now = 7.1  # no sample at all in the window: NOT_FOUND reads as 0 %, not N/A
        assert by_pid(source.query()) == {8: (0, 0)}


def test_not_supported_is_na_and_not_asked_again(sim: Any, clock: Any) -> None:
    scenario = Scenario(
        gpus=[gpu(buffer=4), gpu(buffer=4)],  # 4 samples fit the first read's buffer: one call
        processes=[
            busy(1, 0, Curve.constant(50), Curve.constant(5)),
            busy(2, 1, Curve.constant(50), Curve.constant(5)),
        ],
        faults=Faults(unsupported={1: ("process_utilization",)}),
    )
    lib = sim(scenario)
    with NvmlSource(clock=clock, wall_clock=driver_time(lib)) as source:
        assert by_pid(source.query()) == {1: (50, 5), 2: (None, None)}
        assert lib.calls["nvmlDeviceGetProcessUtilization"] == 2
        lib.reset_counts()
        clock.advance(1.0)
        assert by_pid(source.query()) == {1: (50, 5), 2: (None, None)}
        assert lib.calls["nvmlDeviceGetProcessUtilization"] == 1  # GPU 1 is not asked again


def test_mig_gpus_are_na_without_a_call(sim: Any, clock: Any) -> None:
    scenario = Scenario(
        gpus=[gpu(mig_mode=True, mig_devices=[SimMigDevice(gpu_instance_id=1)])],
        processes=[
            SimProcess(
                pid=5, gpu_index=0, gpu_instance_id=1, compute_instance_id=0, sm_util=Curve.constant(40)
            )
        ],
    )
    lib = sim(scenario)
    with NvmlSource(clock=clock, wall_clock=driver_time(lib)) as source:
        assert by_pid(source.query()) == {5: (None, None)}
    assert "nvmlDeviceGetProcessUtilization" not in lib.calls


def test_idle_gpus_cost_no_call(sim: Any, clock: Any) -> None:
    lib = sim(
        Scenario(
            gpus=[gpu(buffer=4), gpu(buffer=4)], processes=[busy(3, 1, Curve.constant(9), Curve.constant(1))]
        )
    )
    with NvmlSource(clock=clock, wall_clock=driver_time(lib)) as source:
        assert by_pid(source.query()) == {3: (9, 1)}
    assert lib.calls["nvmlDeviceGetProcessUtilization"] == 1  # GPU 0 has no process to attribute


def test_a_growing_sample_list_uses_the_size_protocol_and_counts_every_call(sim: Any, clock: Any) -> None:
    # 40 busy processes x 8 periods in the 2 s window = 320 samples on the first read.
    procs = [busy(1000 + k, 0, Curve.constant(k % 100 + 1), Curve.constant(k % 7)) for k in range(40)]
    lib = sim(Scenario(gpus=[gpu()], processes=procs))
    with NvmlSource(clock=clock, wall_clock=driver_time(lib)) as source:
        reading = source.query()
        assert reading.calls == lib.total_calls
        assert lib.calls["nvmlDeviceGetProcessUtilization"] == 2  # room for 8, then the 320 it asked for
        assert by_pid(reading) == {1000 + k: (k % 100 + 1, k % 7) for k in range(40)}
        lib.reset_counts()
        clock.advance(0.5)  # the next read's buffer is sized from this one's answer
        reading = source.query()
        assert lib.calls["nvmlDeviceGetProcessUtilization"] == 1
        assert reading.calls == lib.total_calls


def test_machine_source_keeps_the_figures_through_host_enrichment(sim: Any, clock: Any) -> None:
    """With the default wall clock: the simulated driver stamps samples in real CPU time too."""
    import os

    sim(Scenario(gpus=[gpu()], processes=[busy(os.getpid(), 0, Curve.constant(33), Curve.constant(4))]))
    with MachineSource(nvml=NvmlSource(clock=clock)) as machine:
        (proc,) = machine.snapshot().processes
    assert (proc.sm_util, proc.memory_bw_util) == (33, 4)
    assert proc.command is not None and proc.started_at is not None
