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
