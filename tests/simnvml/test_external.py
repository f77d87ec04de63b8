"""Other programs against the simulated box, each in its own process: the environment hook, and
unmodified nvitop and gpustat under ``python -m tui.simnvml.run``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tui.simnvml import CALLS_ENV, SIMULATE_ENV, Faults, Scenario, ScenarioError, install_from_env, uninstall
from tui.simnvml.processes import sleepers
from tui.simnvml.scenario import GiB, MiB

ROOT = Path(__file__).resolve().parents[2]


def run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", **(env or {})}
    full_env.pop(SIMULATE_ENV, None) if env is None or SIMULATE_ENV not in env else None
    return subprocess.run(args, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=ROOT)


def under_sim(
    scenario_path: Path, *program: str, calls: Path | None = None
) -> subprocess.CompletedProcess[str]:
    extra = ["--calls-out", str(calls)] if calls else []
    return run(
        [sys.executable, "-m", "tui.simnvml.run", "--scenario", str(scenario_path), *extra, "--", *program]
    )


@pytest.fixture(scope="module")
def eight_gpu_box(tmp_path_factory):
    """An 8-GPU demo box whose 16 processes are real local sleepers."""
    with sleepers(16) as pids:
        box = Scenario.demo_box(8, pids=pids)
        path = tmp_path_factory.mktemp("sim") / "box.json"
        box.to_json(path)
        yield box, path


def used_v2(box: Scenario, index: int) -> int:
    return sum(int(p.used_memory.at(0)) for p in box.processes if p.gpu_index == index)


def test_install_from_env_in_a_subprocess_writes_call_counts(tmp_path):
    box_path, calls_path = tmp_path / "box.json", tmp_path / "calls.json"
    Scenario.build(3, 5).to_json(box_path)
    code = (
        "from tui.simnvml import install_from_env; import pynvml\n"
        "lib = install_from_env(); pynvml.nvmlInit()\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(2)\n"
        "print(pynvml.nvmlDeviceGetCount(), len(pynvml.nvmlDeviceGetComputeRunningProcesses(h)))\n"
    )
    result = run([sys.executable, "-c", code], env={SIMULATE_ENV: str(box_path), CALLS_ENV: str(calls_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "1"]  # processes 2 of 5 round-robin -> GPU 2 has one
    counts = json.loads(calls_path.read_text())
    assert counts["calls"]["nvmlDeviceGetCount_v2"] == 1
    assert counts["calls"]["nvmlDeviceGetComputeRunningProcesses_v3"] == 2  # size query, then the fill
    assert counts["total"] == sum(counts["calls"].values()) == 5  # init, count, handle, 2 × processes


def test_install_from_env_in_process(tmp_path):
    assert install_from_env({}) is None
    assert install_from_env({SIMULATE_ENV: "  "}) is None
    with pytest.raises(ScenarioError, match="cannot read"):
        install_from_env({SIMULATE_ENV: str(tmp_path / "absent.json")})
    path = tmp_path / "box.json"
    Scenario.build(2).to_json(path)
    try:
        lib = install_from_env({SIMULATE_ENV: str(path)})
        assert lib is not None and len(lib.scenario.gpus) == 2
    finally:
        uninstall()


def test_nvitop_once_shows_the_scenario(eight_gpu_box, tmp_path):
    box, path = eight_gpu_box
    calls = tmp_path / "nvitop-calls.json"
    result = under_sim(path, "nvitop", "--once", calls=calls)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Driver Version: 550.54.15" in out
    assert out.count("H100 80GB HBM3") == 8
    total_gib = f"{box.gpus[0].memory_total / GiB:.2f}GiB"
    for i, gpu in enumerate(box.gpus):
        assert gpu.bus_id in out
        assert f"{used_v2(box, i) / GiB:.2f}GiB / {total_gib}" in out
    for proc in box.processes:
        assert str(proc.pid) in out
    counts = json.loads(calls.read_text())
    assert counts["calls"]["nvmlDeviceGetMemoryInfo_v2"] == 8
    assert counts["calls"]["nvmlShutdown"] == 1  # nvitop's atexit hook ran before the counts were written
    assert counts["errors"] == [] and counts["total"] > 100


def test_gpustat_json_shows_the_scenario(eight_gpu_box, tmp_path):
    box, path = eight_gpu_box
    result = under_sim(path, "gpustat", "--json", calls=tmp_path / "gpustat-calls.json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["driver_version"] == "550.54.15"
    assert [g["name"] for g in report["gpus"]] == [g.name for g in box.gpus]
    assert [g["uuid"] for g in report["gpus"]] == [g.uuid for g in box.gpus]
    for i, g in enumerate(report["gpus"]):
        assert g["memory.total"] == box.gpus[i].memory_total // MiB
        assert g["memory.used"] == used_v2(box, i) // MiB
        assert g["fan.speed"] is None  # SXM boards have no fan
        expected = {p.pid: int(p.used_memory.at(0)) // MiB for p in box.processes if p.gpu_index == i}
        assert {p["pid"]: p["gpu_memory_usage"] for p in g["processes"]} == expected
        assert {p["command"] for p in g["processes"]} == {"python"}


def test_old_driver_makes_nvitop_and_gpustat_fall_back(tmp_path):
    box = Scenario.build(2, 4, faults=Faults(old_driver=True))
    path = tmp_path / "old.json"
    box.to_json(path)
    gpustat = under_sim(path, "gpustat", "--json", "--no-processes")
    assert gpustat.returncode == 0, gpustat.stderr
    report = json.loads(gpustat.stdout)
    gpu = box.gpus[0]
    # no nvmlDeviceGetMemoryInfo_v2: gpustat falls back to v1, whose "used" includes the reservation
    assert report["gpus"][0]["memory.used"] == (used_v2(box, 0) + gpu.memory_reserved) // MiB
    calls = tmp_path / "calls.json"
    nvitop = under_sim(path, "nvitop", "--once", calls=calls)
    assert nvitop.returncode == 0, nvitop.stderr
    for proc in box.processes:  # listed through the _v2 process call, with the right struct layout
        assert f" {proc.pid} " in nvitop.stdout
    counts = json.loads(calls.read_text())
    assert counts["calls"]["nvmlDeviceGetComputeRunningProcesses_v2"] > 0
    assert "nvmlDeviceGetComputeRunningProcesses_v3" in counts["missing"]


def test_no_library_makes_nvitop_fail_with_a_message(tmp_path):
    path = tmp_path / "none.json"
    Scenario.build(1, faults=Faults(library_missing=True)).to_json(path)
    result = under_sim(path, "nvitop", "--once")
    assert result.returncode != 0
    assert "NVML" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_runner_reports_bad_input(tmp_path):
    result = under_sim(tmp_path / "absent.json", "nvitop", "--once")
    assert result.returncode == 2 and "cannot read scenario" in result.stderr
    path = tmp_path / "box.json"
    Scenario.build(1).to_json(path)
    result = under_sim(path, "no-such-program-xyz")
    assert result.returncode == 2 and "no console script" in result.stderr
    result = under_sim(path, "-m", "json.tool", "--help")
    assert result.returncode == 0 and "usage" in result.stdout.lower()


def test_runner_falls_back_to_entry_points_without_a_wrapper_script(tmp_path):
    path = tmp_path / "box.json"
    Scenario.build(1).to_json(path)
    code = (
        "import sys, tui.simnvml.run as r\n"
        f"sys.exit(r.main(['--scenario', {str(path)!r}, '--', 'nvitop', '--version'], lambda name: None))\n"
    )
    result = run([sys.executable, "-c", code])
    assert result.returncode == 0, result.stderr
    assert "nvitop" in result.stdout.lower()


def test_a_lost_gpu_shows_as_lost_in_gpustat_and_na_in_nvitop(tmp_path):
    box = Scenario.build(3, faults=Faults(lost_after_s={1: 0.0}))
    path = tmp_path / "lost.json"
    box.to_json(path)
    gpustat = under_sim(path, "gpustat", "--json", "--no-processes")
    assert gpustat.returncode == 0, gpustat.stderr
    names = [g["name"] for g in json.loads(gpustat.stdout)["gpus"]]
    assert names == [box.gpus[0].name, "((GPU is lost))", box.gpus[2].name]
    nvitop = under_sim(path, "nvitop", "--once")
    assert nvitop.returncode == 0, nvitop.stderr
    assert box.gpus[0].bus_id in nvitop.stdout and box.gpus[2].bus_id in nvitop.stdout
    assert box.gpus[1].bus_id not in nvitop.stdout  # every field of GPU 1 reads N/A
