"""The NVML source through unmodified pynvml against the simulated library: values field by field."""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import pytest

from tui.simnvml import Curve, Scenario, SimMigDevice, SimProcess
from tui.sources.machine import MachineSource
from tui.sources.model import GpuInfo
from tui.sources.nvml import NvmlSource

MiB = 1 << 20
GiB = 1 << 30
MODES = ("Default", "Exclusive_Process", "Prohibited")


def varied_box(n_gpus: int, n_processes: int) -> Scenario:
    """``n_gpus`` GPUs that differ in every field, so a mixed-up index or field cannot pass."""
    scenario = Scenario.build(n_gpus, n_processes, process_memory=GiB)
    for i, gpu in enumerate(scenario.gpus):
        scenario.gpus[i] = dataclasses.replace(
            gpu,
            name=f"NVIDIA Sim GPU {i}",
            memory_total=(40_000 + 1_000 * i) * MiB,
            memory_reserved=(500 + i) * MiB,
            memory_other_used=(7 + i) * MiB,
            power_limit_w=300.0 + 10 * i,
            fan_percent=Curve.constant(20 + i),
            temperature_c=Curve.constant(40 + i),
            power_w=Curve(base=100 + 5 * i, amplitude=50, period_s=20),
            gpu_util=Curve.constant(10 + 3 * i),
            memory_util=Curve.constant(5 + 2 * i),
            performance_state=i % 3,
            persistence_mode=i % 2 == 0,
            display_active=i % 4 == 1,
            ecc_volatile_uncorrected=i * 2,
            compute_mode=MODES[i % 3],
        )
    return scenario


def gpu_dict(info: Any) -> dict[str, Any]:
    return dataclasses.asdict(info)


@pytest.mark.parametrize("n_gpus", [1, 8, 16])
def test_every_gpu_field_matches_the_scenario(n_gpus: int, sim: Any, clock: Any, expect: ModuleType) -> None:
    scenario = varied_box(n_gpus, n_processes=2 * n_gpus)
    sim(scenario)
    with NvmlSource(clock=clock) as source:
        for t in (0.0, 7.0):  # the power curve moves; fast fields must follow it
            clock.now = t
            reading = source.query()
            assert reading.status.available
            assert reading.status.driver_version == scenario.driver_version
            assert reading.status.cuda_driver_version == "12.4"
            assert reading.status.nvml_version == scenario.nvml_version
            assert len(reading.gpus) == n_gpus
            for i, info in enumerate(reading.gpus):
                assert gpu_dict(info) == expect.gpu_fields(scenario, i, t), f"GPU {i} at t={t}"
            got = {(p.gpu_index, p.pid): p for p in reading.processes}
            want = expect.processes(scenario, t)
            assert set(got) == set(want)
            for key, fields in want.items():
                p = got[key]
                assert {k: getattr(p, k) for k in fields} == fields


def test_sixty_four_processes_and_their_memory(sim: Any, clock: Any, expect: ModuleType) -> None:
    scenario = Scenario.build(8, 64, process_memory=512 * MiB)
    sim(scenario)
    with NvmlSource(clock=clock) as source:
        for _ in range(2):  # second pass reuses the buffer sized by the first
            reading = source.query()
            assert len(reading.processes) == 64
            want = expect.processes(scenario, 0.0)
            assert {(p.gpu_index, p.pid): p.gpu_memory for p in reading.processes} == {
                k: v["gpu_memory"] for k, v in want.items()
            }


def test_process_list_growing_between_refreshes(sim: Any, clock: Any) -> None:
    scenario = Scenario.build(1, 1)
    lib = sim(scenario)
    with NvmlSource(clock=clock) as source:
        assert len(source.query().processes) == 1
        # 40 more processes than the buffer sized for one: the size protocol must kick in.
        scenario.processes.extend(SimProcess(pid=200_000 + k, gpu_index=0) for k in range(40))
        assert len(lib.scenario.processes) == 41
        assert {p.pid for p in source.query().processes} == {p.pid for p in scenario.processes}


def test_compute_graphics_and_both(sim: Any, clock: Any) -> None:
    scenario = Scenario.build(2, 0)
    scenario.processes = [
        SimProcess(pid=11, gpu_index=0, type="C", used_memory=Curve.constant(3 * GiB)),
        SimProcess(pid=12, gpu_index=0, type="G", used_memory=Curve.constant(20 * MiB)),
        SimProcess(pid=13, gpu_index=1, type="C+G", used_memory=Curve.constant(5 * GiB)),
    ]
    sim(scenario)
    with NvmlSource(clock=clock) as source:
        got = {p.pid: (p.gpu_index, p.type, p.gpu_memory) for p in source.query().processes}
    assert got == {11: (0, "C", 3 * GiB), 12: (0, "G", 20 * MiB), 13: (1, "C+G", 5 * GiB)}


def test_mig_instance_ids(sim: Any, clock: Any) -> None:
    scenario = Scenario.build(2, 0)
    scenario.gpus[0] = dataclasses.replace(
        scenario.gpus[0],
        mig_mode=True,
        mig_devices=[SimMigDevice(gpu_instance_id=1, compute_instance_id=0), SimMigDevice(gpu_instance_id=2)],
    )
    one = Curve.constant(GiB)
    scenario.processes = [
        SimProcess(pid=21, gpu_index=0, gpu_instance_id=1, compute_instance_id=0, used_memory=one),
        SimProcess(pid=22, gpu_index=0, gpu_instance_id=2, compute_instance_id=0, used_memory=one),
        SimProcess(pid=23, gpu_index=1, used_memory=one),
    ]
    sim(scenario)
    with NvmlSource(clock=clock) as source:
        reading = source.query()
    ids = {p.pid: (p.gpu_instance_id, p.compute_instance_id) for p in reading.processes}
    assert ids == {21: (1, 0), 22: (2, 0), 23: (None, None)}
    assert reading.gpus[0].mig_mode is True and reading.gpus[1].mig_mode is False
    assert reading.gpus[0].gpu_util is None  # no whole-GPU utilization under MIG, like real GPUs


def test_warm_refresh_is_cheaper_than_cold(sim: Any, clock: Any) -> None:
    scenario = Scenario.build(8, 64)
    lib = sim(scenario)
    with NvmlSource(clock=clock, slow_ttl=5.0) as source:
        cold = source.query()
        cold_calls = lib.total_calls
        assert cold.calls == cold_calls  # our own count agrees with the library's
        lib.reset_counts()
        clock.advance(1.0)
        warm = source.query()
        warm_calls = dict(lib.calls)
        assert warm.calls == sum(warm_calls.values()) < cold_calls
        # Identity and slow fields came from the cache; process lists took one call each, not two.
        for symbol in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo_v3",
                       "nvmlDeviceGetTemperatureV", "nvmlDeviceGetPowerManagementLimit"):  # fmt: skip
            assert symbol not in warm_calls
        assert warm_calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 8
        assert warm_calls["nvmlDeviceGetMemoryInfo_v2"] == 8
        assert warm.gpus == tuple(
            dataclasses.replace(g, power_w=w.power_w) for g, w in zip(cold.gpus, warm.gpus, strict=True)
        )
        # After the slow TTL the slow tier is read again, once per GPU; identity never.
        lib.reset_counts()
        clock.advance(5.0)
        source.query()
        assert lib.calls["nvmlDeviceGetTemperatureV"] == 8
        assert lib.calls["nvmlDeviceGetName"] == 0


def test_slow_fields_cached_fast_fields_live(sim: Any, clock: Any) -> None:
    scenario = Scenario.build(1, 0)
    scenario.gpus[0] = dataclasses.replace(
        scenario.gpus[0],
        temperature_c=Curve(keyframes=((0.0, 40.0), (10.0, 60.0))),
        power_w=Curve(keyframes=((0.0, 100.0), (10.0, 300.0))),
    )
    sim(scenario)
    with NvmlSource(clock=clock, slow_ttl=5.0) as source:
        assert (source.query().gpus[0].temperature_c, source.query().gpus[0].power_w) == (40, 100.0)
        clock.now = 2.0
        g = source.query().gpus[0]
        assert (g.temperature_c, g.power_w) == (40, 140.0)  # temperature from the 5 s cache
        clock.now = 5.0
        g = source.query().gpus[0]
        assert (g.temperature_c, g.power_w) == (50, 200.0)


def test_machine_source_reports_its_call_cost(sim: Any, clock: Any) -> None:
    lib = sim(Scenario.build(8, 64))
    with MachineSource(nvml=NvmlSource(clock=clock)) as machine:
        machine.snapshot()
        lib.reset_counts()
        snap = machine.snapshot()
        assert machine.last_nvml_calls == lib.total_calls > 0
        assert len(snap.gpus) == 8 and len(snap.processes) == 64


def test_env_simulation_is_installed_once_at_start_up_and_sources_read_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, expect: ModuleType
) -> None:
    """ANATOMY_TOP_SIMULATE is read in one place, the command line's start-up; the data layer never
    looks at it and reads whatever NVML pynvml finds (two sources share the one installed library)."""
    import tui.simnvml as simnvml
    from tui import cli

    scenario = varied_box(2, 2)
    path = tmp_path / "box.json"
    scenario.to_json(path)
    monkeypatch.setenv("ANATOMY_TOP_SIMULATE", str(path))
    simnvml.uninstall()
    try:
        untouched = NvmlSource()
        assert not untouched.query().status.available  # the source alone does not install it
        untouched.close()
        assert cli.install_simulation() is None
        lib = simnvml.installed()
        assert lib is not None
        first, second = NvmlSource(), NvmlSource()
        assert first.query().status.available and second.query().status.available
        assert simnvml.installed() is lib
        for source in (first, second):
            reading = source.query()
            assert [g.name for g in reading.gpus] == [g.name for g in scenario.gpus]
            assert reading.gpus[1].memory_total == expect.gpu_fields(scenario, 1, 0.0)["memory_total"]
        first.close()
        second.close()
        path.write_text("{not json")
        reason = cli.install_simulation()
        assert reason is not None and reason.startswith("simulated NVML (ANATOMY_TOP_SIMULATE)")
        broken = NvmlSource(unavailable_reason=reason)
        assert broken.query().status.reason == reason
    finally:
        simnvml.uninstall()


def test_cache_tiers_cover_every_gpu_field_once(sim: Any) -> None:
    import pynvml

    from tui.sources import nvml_fields
    from tui.sources import nvml_reading as nvml

    tiers = (nvml.IDENTITY_FIELDS, nvml.SLOW_FIELDS, nvml.FAST_FIELDS)
    names = [name for tier in tiers for name in tier]
    assert len(names) == len(set(names))
    assert set(names) == {f.name for f in dataclasses.fields(GpuInfo)} - {"index", "lost", "error"}

    def first(*alternatives: tuple[str, Any]) -> Any:  # the first symbol the simulated driver has
        for _symbol, call in alternatives:
            try:
                return call()
            except pynvml.NVMLError_FunctionNotFound:
                continue
        return None

    sim(Scenario.build(1, 0))
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        identity = nvml_fields.read_identity(pynvml, first, lambda *args: None, h, ())
        slow = nvml_fields.read_slow(pynvml, first, h, ())
        fast = nvml_fields.read_fast(pynvml, first, h)
    finally:
        pynvml.nvmlShutdown()
    assert (tuple(identity), tuple(slow), tuple(fast)) == tiers
    assert identity["name"] and identity["bus_id"] and fast["memory_total"]  # read, not left None
