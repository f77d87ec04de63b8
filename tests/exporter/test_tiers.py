"""NVML calls per scrape, counted by the simulated library itself: the fast fields (memory, utilization,
power, processes) at every scrape, the slow ones (temperature, fan, power limit, ECC, MIG mode) once per
``SLOW_TTL_S``, nvidia-smi's own fields (persistence, display, performance state, compute mode) never —
and what the exporter says it made is what the library counted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tui import simnvml
from tui.exporter.collector import NodeCollector

FAST = (
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetProcessUtilization",
)
SLOW = (
    "nvmlDeviceGetTemperatureV",
    "nvmlDeviceGetFanSpeed",
    "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetTotalEccErrors",
    "nvmlDeviceGetMigMode",
)
NOT_EXPORTED = (
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetDisplayActive",
    "nvmlDeviceGetPerformanceState",
    "nvmlDeviceGetComputeMode",
    "nvmlSystemGetNVMLVersion",
)
GPUS = 3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_slow_fields_wait_for_their_ttl_and_fast_fields_come_every_scrape(
    sim: Callable[..., Any], scrape: Callable[..., Any], one: Callable[..., float]
) -> None:
    from tui.simnvml.processes import sleepers

    with sleepers(GPUS * 2) as pids:
        lib = sim(simnvml.Scenario.demo_box(GPUS, pids=pids))
        clock = Clock()
        collector = NodeCollector(clock=clock, read_ahead=False)  # every read at its scrape: counted there
        first = scrape(collector)  # opens NVML: identity, slow and fast fields of every GPU
        assert all(lib.calls[s] >= GPUS for s in SLOW)
        temperature = {g: one(first, "anatomy_gpu_temperature_celsius", gpu=str(g)) for g in range(GPUS)}

        per_scrape = []
        for step in range(1, 4):  # well within the slow tier's lifetime
            lib.reset_counts()
            clock.now += 5.0
            series = scrape(collector)
            calls = dict(lib.calls)
            per_scrape.append(sum(calls.values()))
            assert {s: calls.get(s, 0) for s in FAST} == dict.fromkeys(FAST, GPUS), step
            assert not any(calls.get(s) for s in SLOW), f"slow fields re-read within their TTL: {calls}"
            assert not any(calls.get(s) for s in NOT_EXPORTED), calls
            # The collector counts its calls itself; the series says what the library counted.
            assert one(series, "anatomy_exporter_nvml_calls") == sum(calls.values())
            # Slow values are the cached ones; every GPU still has them.
            for g in range(GPUS):
                assert one(series, "anatomy_gpu_temperature_celsius", gpu=str(g)) == temperature[g]
        # Nothing but the fast fields: 6 calls per GPU (memory, utilization, power, two process
        # lists, per-process utilization).
        assert per_scrape == [len(FAST) * GPUS] * 3

        lib.reset_counts()
        clock.now += NodeCollector.SLOW_TTL_S  # the slow tier has aged out: one read per GPU
        scrape(collector)
        calls = dict(lib.calls)
        assert {s: calls.get(s, 0) for s in SLOW} == dict.fromkeys(SLOW, GPUS), calls
        assert {s: calls.get(s, 0) for s in FAST} == dict.fromkeys(FAST, GPUS), calls
        assert not any(calls.get(s) for s in NOT_EXPORTED), calls


def test_every_gpu_is_read_when_they_are_read_side_by_side(
    sim: Callable[..., Any], scrape: Callable[..., Any], pick: Callable[..., Any]
) -> None:
    """8 GPUs on the exporter's worker threads: every GPU's series, none twice (parse checks that)."""
    sim(simnvml.Scenario.demo_box(8))
    collector = NodeCollector()
    for _ in range(3):
        series = scrape(collector)
        used = pick(series, "anatomy_gpu_memory_used_bytes")
        assert sorted(dict(lab)["gpu"] for lab in used) == [str(i) for i in range(8)]
