"""Scenario data: curves, presets, the JSON form and its validation."""

from __future__ import annotations

import json
import math

import pytest

from tui.simnvml import Curve, Faults, Scenario, ScenarioError, SimGpu, SimMigDevice, SimProcess
from tui.simnvml.curves import curve_from_json
from tui.simnvml.scenario import MiB


def test_sine_curve_values():
    c = Curve(base=60, amplitude=10, period_s=20, phase_s=5)
    for t in (0.0, 3.0, 12.5, 100.0):
        assert c.at(t) == pytest.approx(60 + 10 * math.sin(2 * math.pi * (t + 5) / 20))


def test_keyframes_interpolate_hold_repeat_and_clamp():
    ramp = Curve(keyframes=((0.0, 0.0), (10.0, 100.0), (20.0, 50.0)))
    assert [ramp.at(t) for t in (-5, 0, 5, 10, 15, 20, 99)] == [0, 0, 50, 100, 75, 50, 50]
    loop = Curve(keyframes=((0.0, 0.0), (10.0, 100.0)), repeat=True)
    assert loop.at(15.0) == pytest.approx(50.0)
    assert loop.at(32.5) == pytest.approx(25.0)
    clamped = Curve(base=95, amplitude=20, period_s=4, maximum=100, minimum=80)
    assert clamped.at(1.0) == 100  # peak 115, clamped
    assert clamped.at(3.0) == 80  # trough 75, clamped
    with pytest.raises(ScenarioError):
        Curve(keyframes=((5.0, 1.0), (1.0, 2.0)))
    with pytest.raises(ScenarioError):
        Curve(period_s=0)


def test_curve_json_forms():
    assert curve_from_json(42, "x").at(123.0) == 42
    c = curve_from_json({"keyframes": [[0, 1], [2, 3]]}, "x")
    assert c.at(1.0) == 2.0 and c.base == 1.0
    assert curve_from_json(c.to_json_value(), "x") == c
    for bad in ("hot", True, {"bogus": 1}, {"keyframes": [[0]]}):
        with pytest.raises(ScenarioError, match=r"^x"):
            curve_from_json(bad, "x")


def test_demo_box_preset():
    pids = list(range(2000, 2064))
    box = Scenario.demo_box(n_gpus=8, pids=pids)
    assert len(box.gpus) == 8 and {g.name for g in box.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert box.driver_version.startswith("550.") and box.cuda_driver_version == 12040
    assert [p.pid for p in box.processes] == pids
    assert [p.gpu_index for p in box.processes[:9]] == [0, 1, 2, 3, 4, 5, 6, 7, 0]
    for i, gpu in enumerate(box.gpus):
        used = sum(p.used_memory.at(0) for p in box.processes if p.gpu_index == i)
        assert 0.75 * gpu.memory_total < used < gpu.memory_total - gpu.memory_reserved
        samples = {round(gpu.gpu_util.at(t)) for t in range(0, 60, 3)}
        assert len(samples) > 3 and all(0 <= s <= 100 for s in samples)  # it varies, within range
        assert 0 < gpu.power_w.at(7.0) <= gpu.power_limit_w
    assert len({g.uuid for g in box.gpus}) == 8
    assert Scenario.demo_box(2).processes == []
    assert Scenario.demo_box(0, pids=[1, 2]).processes == []


def full_box() -> Scenario:
    return Scenario(
        gpus=[
            SimGpu(fan_percent=Curve(base=40, amplitude=5, period_s=9), num_fans=2),
            SimGpu(
                name="NVIDIA A100-SXM4-80GB",
                mig_mode=True,
                mig_devices=[SimMigDevice(gpu_instance_id=3, compute_instance_id=1)],
                power_w=Curve(keyframes=((0.0, 90.0), (60.0, 380.0)), repeat=True),
                cuda_compute_capability=(8, 0),
                architecture="Ampere",
            ),
        ],
        processes=[
            SimProcess(pid=11, gpu_index=0, type="C+G", used_memory=Curve(base=MiB, amplitude=MiB / 2)),
            SimProcess(pid=12, gpu_index=1, gpu_instance_id=3, compute_instance_id=1),
        ],
        faults=Faults(
            old_driver=True,
            missing_symbols=("nvmlDeviceGetCount_v2",),
            unsupported={1: ("fan", "ecc")},
            lost_after_s={0: 12.5},
            init_error=None,
        ),
        name="full",
    )


def test_json_round_trip(tmp_path):
    for box in (full_box(), Scenario.demo_box(4, pids=[5, 6, 7])):
        path = tmp_path / "box.json"
        box.to_json(path)
        back = Scenario.from_json(path)
        assert back == box
        assert back.to_dict() == json.loads(path.read_text())
        assert back.gpus[0].uuid == box.gpus[0].uuid  # filled-in defaults are kept


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(colour="red"), "unknown keys"),
        (lambda d: d["gpus"][0].update(watts=3), r"gpus\[0\]: unknown keys"),
        (lambda d: d["processes"][0].update(gpu_index=7), "no GPU 7"),
        (lambda d: d["processes"][0].update(type="X"), "type must be"),
        (lambda d: d["faults"].update(init_error="SOMETIMES"), "unknown NVML error"),
        (lambda d: d["faults"]["unsupported"].update({"0": ["colour"]}), "unknown fields"),
        (lambda d: d["gpus"][0].update(power_w="hot"), r"gpus\[0\].power_w"),
        (lambda d: d["gpus"][1].update(uuid=d["gpus"][0]["uuid"]), "duplicate GPU uuid"),
        (lambda d: d.update(gpus=[d["gpus"][0]] * 17, processes=[]), "0 to 16 GPUs"),
        (lambda d: d["gpus"][0].update(compute_mode="Sometimes"), "compute_mode"),
        (lambda d: d["gpus"][0].update(memory_reserved=10**15), "exceeds"),
        (lambda d: d.update(gpus={}), "expected a list"),
    ],
)
def test_invalid_scenarios_are_reported(mutate, message):
    data = full_box().to_dict()
    mutate(data)
    with pytest.raises(ScenarioError, match=message):
        Scenario.from_dict(data)


def test_unreadable_files_are_reported(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        Scenario.from_json(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        Scenario.from_json(bad)
    bad.write_text("[]")
    with pytest.raises(ScenarioError, match="JSON object"):
        Scenario.from_json(bad)


def test_builder():
    box = Scenario.build(3, 7, pids=list(range(50, 57)), process_memory=2 * MiB)
    assert len(box.gpus) == 3 and len({g.bus_id for g in box.gpus}) == 3
    assert [(p.pid, p.gpu_index, p.used_memory.at(0)) for p in box.processes[:4]] == [
        (50, 0, 2 * MiB),
        (51, 1, 3 * MiB),
        (52, 2, 4 * MiB),
        (53, 0, 5 * MiB),
    ]
    with pytest.raises(ScenarioError):
        Scenario.build(17)
    with pytest.raises(ScenarioError):
        Scenario.build(0, 1)
    with pytest.raises(ScenarioError):
        Scenario.build(1, 3, pids=[1])
