"""The one-shot path of ``--once``: ``NvmlSource(omit=...)`` and ``cli.machine_once`` against the live
monitor's ``MachineSource`` on the same simulated box (psutil there, /proc here)."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tui import cli
from tui.simnvml import Curve, Scenario, SimProcess
from tui.sources.machine import MachineSource
from tui.sources.nvml import OMITTABLE_FIELDS, NvmlSource

GiB = 1 << 30


def test_omitted_fields_are_not_asked_for(sim: Any, clock: Any) -> None:
    scenario = Scenario.build(4, 3)
    lib = sim(scenario)
    with NvmlSource(clock=clock) as full_source:
        full = full_source.query()
    asked = dict(lib.calls)
    lib.calls.clear()
    with NvmlSource(clock=clock, omit=OMITTABLE_FIELDS) as lean_source:
        lean = lean_source.query()
    busy_gpus = len({p.gpu_index for p in scenario.processes})
    # A UUID per GPU, the NVML version, per-process utilization per GPU that has processes.
    assert full.calls - lean.calls == len(scenario.gpus) + 1 + busy_gpus
    assert asked["nvmlDeviceGetProcessUtilization"] == busy_gpus
    assert "nvmlDeviceGetProcessUtilization" not in lib.calls
    assert asked["nvmlDeviceGetUUID"] == len(scenario.gpus) and "nvmlDeviceGetUUID" not in lib.calls
    assert "nvmlSystemGetNVMLVersion" not in lib.calls
    assert lean.status.nvml_version is None and full.status.nvml_version is not None
    for a, b in zip(full.gpus, lean.gpus, strict=True):
        assert b.uuid is None and a.uuid == scenario.gpus[a.index].uuid
        assert dataclasses.replace(a, uuid=None) == b  # everything else identical
    assert all(p.sm_util is None and p.memory_bw_util is None for p in lean.processes)
    assert all(p.sm_util == 0 and p.memory_bw_util == 0 for p in full.processes)  # idle: no samples
    unsampled = [dataclasses.replace(p, sm_util=None, memory_bw_util=None) for p in full.processes]
    assert list(lean.processes) == unsampled


def test_unknown_omit_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot omit"):
        NvmlSource(omit=("memory_used",))


def test_machine_once_equals_the_monitors_first_snapshot(
    sim: Any,
    spawn: Callable[[str], subprocess.Popen[bytes]],
    exited_pid: int,
    wait_until_asleep: Callable[[int], None],
) -> None:
    procs = [spawn("python train.py --rank 0 [x]"), spawn("python eval.py")]
    for p in procs:
        wait_until_asleep(p.pid)
    scenario = Scenario.build(3, 0)
    pids = [procs[0].pid, procs[1].pid, procs[0].pid, exited_pid]
    scenario.processes = [
        SimProcess(pid=pid, gpu_index=i % 3, type="C", used_memory=Curve.constant((i + 1) * GiB))
        for i, pid in enumerate(pids)
    ]
    sim(scenario)
    mine, calls = cli.machine_once()
    with MachineSource() as source:
        reference = source.snapshot()
    assert calls == source.last_nvml_calls
    # Field by field over the whole snapshot, so a field the monitor's path gains shows up here too.
    # Left out: what moves between the two readings (clock, power curve, memory, load, running time)
    # and RSS (both read statm, but a moment apart; test_procfs compares it with psutil).
    assert dataclasses.replace(mine, time=0.0, gpus=(), processes=(), host=mine.host) == dataclasses.replace(
        reference, time=0.0, gpus=(), processes=(), host=mine.host
    )
    assert [dataclasses.replace(g, power_w=None) for g in mine.gpus] == [
        dataclasses.replace(g, power_w=None) for g in reference.gpus
    ]
    assert len(mine.processes) == len(reference.processes) == 4
    for a, b in zip(mine.processes, reference.processes, strict=True):
        if b.running_time_s is not None:
            assert a.running_time_s == pytest.approx(b.running_time_s, abs=2.0)  # read moments apart
        assert dataclasses.replace(a, running_time_s=None, host_rss=None) == dataclasses.replace(
            b, running_time_s=None, host_rss=None
        )
    assert [p.alive for p in mine.processes if p.pid == exited_pid] == [False]
    volatile = {"memory_used": None, "memory_available": None, "load_avg": None, "swap_used": None}
    assert dataclasses.replace(mine.host, **volatile) == dataclasses.replace(reference.host, **volatile)
    assert mine.host.cpu_percent is None
