"""The ``--once --json`` document, from hand-built snapshots."""

from __future__ import annotations

import dataclasses
import json
from types import ModuleType

from tui.report.once_json import SCHEMA, SCHEMA_VERSION, render_json
from tui.sources.model import GpuInfo, GpuProcess, NvmlStatus


def roundtrip(doc: dict) -> dict:
    return json.loads(json.dumps(doc, allow_nan=False))


def test_document_shape_and_values(shots: ModuleType) -> None:
    gpus = (shots.full_gpu(0), shots.bare_gpu(1), GpuInfo(index=2, lost=True, error="GPU is lost"))
    procs = (
        GpuProcess(
            gpu_index=0, pid=4242, type="C", gpu_memory=123, command="python train.py [rank0]", user="a"
        ),
        GpuProcess(gpu_index=1, pid=7, type="C+G", name="[/]", alive=False),
    )
    snap = shots.snapshot(gpus=gpus, processes=procs)
    doc = roundtrip(render_json(snap, nvml_calls=40))
    assert doc["schema"] == SCHEMA == "anatomy-top/once" and doc["schema_version"] == SCHEMA_VERSION == 1
    assert doc["time"] == snap.time and doc["time_iso"].startswith("2025-11-21T")
    assert doc["nvml"] == {
        "available": True,
        "reason": None,
        "driver_version": "550.54.15",
        "cuda_driver_version": "12.4",
        "nvml_version": "12.550",
        "calls": 40,
    }
    assert doc["gpus"] == [dataclasses.asdict(g) for g in gpus]
    assert doc["gpus"][1]["fan_percent"] is None and doc["gpus"][2]["lost"] is True
    assert doc["processes"] == [dataclasses.asdict(p) for p in procs]
    assert doc["processes"][0]["command"] == "python train.py [rank0]"  # verbatim
    assert doc["processes"][1]["name"] == "[/]"
    host = dataclasses.asdict(snap.host) | {"load_avg": list(snap.host.load_avg)}
    assert doc["host"] == host
    assert doc["training"] == []


def test_training_passed_through_and_non_finite_is_null(shots: ModuleType) -> None:
    snap = shots.snapshot(gpus=(dataclasses.replace(shots.full_gpu(0), power_w=float("nan")),))
    training = [{"pid": 1, "state": "live", "snapshot": {"step": 3}}]
    doc = roundtrip(render_json(snap, training))
    assert doc["training"] == training
    assert doc["gpus"][0]["power_w"] is None


def test_no_driver(shots: ModuleType) -> None:
    reason = "NVIDIA driver not found (libnvidia-ml.so.1 could not be loaded)"
    doc = roundtrip(render_json(shots.snapshot(status=NvmlStatus(available=False, reason=reason))))
    assert doc["nvml"]["available"] is False and doc["nvml"]["reason"] == reason
    assert doc["gpus"] == [] and doc["processes"] == [] and doc["host"]["hostname"] == "node-17"


def test_iso_time_equals_datetimes() -> None:
    import random
    from datetime import datetime, timezone

    from tui.report.once_json import iso_utc

    rng = random.Random(7)
    samples = [0.0, 1.5, 1763717405.25, 1763717405.0000004, 1763717405.9999996, 1e9 + 0.999_999_5]
    samples += [rng.uniform(0, 4e9) for _ in range(2000)] + [rng.randrange(0, 4 * 10**9) for _ in range(200)]
    for t in samples:
        assert iso_utc(t) == datetime.fromtimestamp(t, tz=timezone.utc).isoformat(), t


def test_field_copy_equals_asdict(shots: ModuleType) -> None:
    from tui.report.once_json import gpu_dict, host_dict, process_dict

    snap = shots.snapshot(gpus=(shots.full_gpu(0), shots.bare_gpu(1)))
    proc = GpuProcess(gpu_index=0, pid=1, type="C", command="x", running_time_s=2.5)
    assert [gpu_dict(g) for g in snap.gpus] == [dataclasses.asdict(g) for g in snap.gpus]
    assert process_dict(proc) == dataclasses.asdict(proc)
    host = host_dict(snap.host)
    assert host == dataclasses.asdict(snap.host) | {"load_avg": list(snap.host.load_avg)}
    assert isinstance(host["load_avg"], list)  # JSON has no tuples


def test_the_report_package_loads_a_renderer_only_when_asked() -> None:
    import subprocess
    import sys

    code = (
        "import sys, tui.report as r\n"
        "before = {'tui.report.smi_text', 'tui.report.once_json'} & set(sys.modules)\n"
        "f = r.render_json\n"
        "after = {'tui.report.smi_text', 'tui.report.once_json'} & set(sys.modules)\n"
        "print(sorted(before), sorted(after), f.__module__, r.SCHEMA)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "['tui.report.once_json']", "tui.report.once_json", SCHEMA]
    import tui.report

    assert tui.report.render_text.__module__ == "tui.report.smi_text"
    try:
        tui.report.nothing_here  # noqa: B018
    except AttributeError as exc:
        assert "nothing_here" in str(exc)
    else:
        raise AssertionError("unknown names must raise AttributeError")
