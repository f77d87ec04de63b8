"""Every NVML failure is a value: unsupported fields, old drivers, lost GPUs, init failures, no library."""

from __future__ import annotations

import dataclasses
import threading
from types import ModuleType
from typing import Any

import pytest

from tui.report.smi_text import render_text
from tui.simnvml import OLD_DRIVER_MISSING, Faults, Scenario
from tui.sources import nvml
from tui.sources.machine import MachineSource
from tui.sources.model import GpuInfo
from tui.sources.nvml import CLOSED_REASON, LIBRARY_MISSING_REASON, NvmlSource


def _rows(text: str, index: int) -> list[list[str]]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = line.split("|")[1:-1]
        if len(cells) == 3 and cells[0].split()[:1] == [str(index)]:
            return [[c.strip() for c in lines[i + k].split("|")[1:-1]] for k in range(3)]
    raise AssertionError(text)


def test_unsupported_fields_are_none_and_na_in_text(sim: Any, clock: Any, expect: ModuleType) -> None:
    unsupported = ("fan", "ecc", "temperature", "power_usage", "mig_mode", "utilization", "persistence_mode")
    scenario = Scenario.build(2, 0, faults=Faults(unsupported={1: unsupported}))
    sim(scenario)
    with MachineSource(nvml=NvmlSource(clock=clock)) as machine:
        snap = machine.snapshot()
    bad, good = snap.gpus[1], snap.gpus[0]
    assert dataclasses.asdict(good) == expect.gpu_fields(scenario, 0, 0.0)
    nulls = ("fan_percent", "ecc_volatile_uncorrected", "temperature_c", "power_w", "mig_mode", "gpu_util",
             "memory_util", "persistence_mode")  # fmt: skip
    want = expect.gpu_fields(scenario, 1, 0.0) | dict.fromkeys(nulls)
    assert dataclasses.asdict(bad) == want
    row1, row2, row3 = _rows(render_text(snap), 1)
    assert row1[0].split()[-1] == "N/A"  # persistence
    assert row1[2] == "N/A"  # ECC
    fan, temp, perf, usage, _slash, cap = row2[0].split()
    assert (fan, temp, perf, usage, cap) == (
        "N/A",
        "N/A",
        "P0",
        "N/A",
        f"{scenario.gpus[1].power_limit_w:.0f}W",
    )
    assert row2[2].split()[0] == "N/A" and row3[2] == "N/A"
    assert _rows(render_text(snap), 0)[2][2] == "Disabled"


def test_old_driver_falls_back_and_never_retries_missing_symbols(
    sim: Any, clock: Any, expect: ModuleType
) -> None:
    extra = (
        "nvmlInitWithFlags",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetPciInfo_v3",
    )
    scenario = Scenario.build(2, 4, faults=Faults(old_driver=True, missing_symbols=extra))
    lib = sim(scenario)
    with NvmlSource(clock=clock, slow_ttl=0.0) as source:  # slow_ttl 0: every field read every refresh
        first = source.query()
        assert first.status.available and first.status.cuda_driver_version == "12.4"
        for i, info in enumerate(first.gpus):
            want = expect.gpu_fields(scenario, i, 0.0)
            g = scenario.gpus[i]
            # nvmlMemory v1: no "reserved", and the reservation counts as used.
            want |= {"memory_reserved": None, "memory_used": want["memory_used"] + g.memory_reserved}
            assert dataclasses.asdict(info) == want
        assert {(p.gpu_index, p.pid, p.gpu_memory) for p in first.processes} == {
            (k[0], k[1], v["gpu_memory"]) for k, v in expect.processes(scenario, 0.0).items()
        }
        looked_up = dict(lib.missing)
        assert set(looked_up) <= set(OLD_DRIVER_MISSING) | set(extra)
        for symbol in ("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV",
                       "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetPciInfo_v3"):  # fmt: skip
            assert looked_up[symbol] == 1, symbol  # asked once for all GPUs, then remembered
        assert source.missing_symbols >= {"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV"}
        for _ in range(3):
            again = source.query()
        assert dict(lib.missing) == looked_up  # not one more lookup of a missing symbol
        assert again.gpus == first.gpus
        assert lib.calls["nvmlDeviceGetMemoryInfo"] == 2 * 4
        assert lib.calls["nvmlDeviceGetTemperature"] == 2 * 4


def test_gpu_lost_mid_run_others_fine(sim: Any, clock: Any, expect: ModuleType) -> None:
    scenario = Scenario.build(4, 8, faults=Faults(lost_after_s={2: 10.0}))
    lib = sim(scenario)
    with MachineSource(nvml=NvmlSource(clock=clock)) as machine:
        before = machine.snapshot()
        assert not any(g.lost for g in before.gpus) and len(before.processes) == 8
        clock.now = 11.0
        after = machine.snapshot()
        lost = after.gpus[2]
        assert lost == GpuInfo(index=2, lost=True, error=lost.error) and lost.error
        assert "lost" in lost.error.lower()
        for i in (0, 1, 3):
            assert dataclasses.asdict(after.gpus[i]) == expect.gpu_fields(scenario, i, 11.0)
        assert {p.gpu_index for p in after.processes} == {0, 1, 3}
        lib.reset_counts()
        machine.snapshot()  # the lost GPU is not asked again: only three GPUs' worth of calls
        assert lib.calls["nvmlDeviceGetMemoryInfo_v2"] == 3
    text = render_text(after)
    assert "ERR!" in _rows(text, 2)[0][0] and "GPU 2: lost" in text


@pytest.mark.parametrize("error", ["DRIVER_NOT_LOADED", "NO_PERMISSION"])
def test_init_failure_is_a_reason(error: str, sim: Any, clock: Any) -> None:
    sim(Scenario.build(2, 0, faults=Faults(init_error=error)))
    with MachineSource(nvml=NvmlSource(clock=clock)) as machine:
        snap = machine.snapshot()
    assert not snap.nvml.available and snap.gpus == ()
    words = {"DRIVER_NOT_LOADED": "Driver Not Loaded", "NO_PERMISSION": "Insufficient Permissions"}[error]
    assert snap.nvml.reason == f"NVML initialisation failed: {words}"
    assert snap.host.memory_total and snap.host.memory_total > 0


def test_init_retried_only_after_the_retry_interval(sim: Any, clock: Any) -> None:
    lib = sim(Scenario.build(1, 0, faults=Faults(init_error="DRIVER_NOT_LOADED")))
    with NvmlSource(clock=clock, init_retry_s=30.0) as source:
        source.query()
        source.query()
        assert lib.calls["nvmlInitWithFlags"] == 1
        clock.advance(31.0)
        source.query()
        assert lib.calls["nvmlInitWithFlags"] == 2


def test_library_missing(sim: Any, clock: Any) -> None:
    sim(Scenario.build(1, 0, faults=Faults(library_missing=True)))
    with MachineSource(nvml=NvmlSource(clock=clock)) as machine:
        snap = machine.snapshot()
    assert snap.nvml.available is False and snap.nvml.reason == LIBRARY_MISSING_REASON
    assert "libnvidia-ml.so.1" in render_text(snap)


def test_zero_gpus(sim: Any, clock: Any) -> None:
    sim(Scenario.build(0, 0))
    with MachineSource(nvml=NvmlSource(clock=clock)) as machine:
        snap = machine.snapshot()
    assert snap.nvml.available and snap.gpus == () and snap.processes == ()
    assert "No devices were found" in render_text(snap)


def test_calls_after_close_are_values(sim: Any, clock: Any) -> None:
    lib = sim(Scenario.build(1, 0))
    source = NvmlSource(clock=clock)
    assert source.query().status.available
    source.close()
    source.close()  # idempotent
    assert lib.calls["nvmlShutdown"] == 1
    reading = source.query()
    assert reading.status.available is False and reading.status.reason == CLOSED_REASON


def test_close_waits_for_the_in_flight_query(sim: Any, clock: Any) -> None:
    """nvmlShutdown must come after the last call of a query already running (nvitop's quit crash)."""
    entered, release = threading.Event(), threading.Event()
    gate = {"armed": False}
    order: list[str] = []

    def block() -> None:
        if gate["armed"] and not entered.is_set():
            entered.set()
            release.wait(10)  # the query is now stuck inside an NVML call

    lib = sim(Scenario.build(2, 0))  # the simulated library reads ``clock`` inside its calls
    clock.on_read = block
    source = NvmlSource(clock=lambda: 0.0)
    source.query()
    gate["armed"] = True
    result: dict[str, Any] = {}
    query = threading.Thread(target=lambda: result.setdefault("r", source.query()))
    query.start()
    assert entered.wait(10)

    def close() -> None:
        source.close()
        order.append("closed")

    closer = threading.Thread(target=close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive() and lib.calls["nvmlShutdown"] == 0  # close is waiting
    release.set()
    query.join(10)
    closer.join(10)
    assert order == ["closed"] and lib.calls["nvmlShutdown"] == 1
    assert result["r"].status.available and len(result["r"].gpus) == 2


def test_gpu_lost_before_the_first_refresh(sim: Any, clock: Any, expect: ModuleType) -> None:
    scenario = Scenario.build(3, 3, faults=Faults(lost_after_s={0: 0.0}))
    sim(scenario)
    with NvmlSource(clock=clock) as source:
        reading = source.query()
    assert reading.gpus[0].lost and reading.gpus[0].name is None
    assert [dataclasses.asdict(g) for g in reading.gpus[1:]] == [
        expect.gpu_fields(scenario, i, 0.0) for i in (1, 2)
    ]
    assert {p.gpu_index for p in reading.processes} == {1, 2}


def test_a_bug_inside_a_pass_is_a_value_not_a_crash(
    sim: Any, clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim(Scenario.build(1, 0))
    with MachineSource(nvml=NvmlSource(clock=clock)) as machine:
        assert machine.snapshot().nvml.available

        def broken(*args: Any) -> Any:
            raise RuntimeError("boom")

        monkeypatch.setattr(nvml, "read_fast", broken)  # a bug in the per-GPU field reading
        snap = machine.snapshot()
        assert snap.nvml.available is False and snap.nvml.reason == "NVML query failed: RuntimeError('boom')"
        assert snap.host.cpu_count  # the host side still stands
        monkeypatch.undo()
        assert machine.snapshot().nvml.available  # and the next refresh recovers
