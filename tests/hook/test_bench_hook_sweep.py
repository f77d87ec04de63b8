"""benchmarks/bench_hook_sweep.py runs end to end on its smallest configuration and prints every column.

Shape only, never timing: three worker processes per configuration, a few rounds, on whatever load the
machine has.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_hook_sweep  # noqa: E402

NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")


def _table(stdout: str) -> tuple[list[str], list[list[str]]]:
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    return header, rows


CPU = max(os.sched_getaffinity(0))  # the workers pinned there (--cpu)


def test_smallest_configuration_prints_every_column(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_hook_sweep.py"),
            "--quick",
            "--depths",
            "2",
            "--widths=",
            "--rounds",
            "3",
            "--loops",
            "plain",
            "--json",
            str(out),
            "--cpu",
            str(CPU),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not measured" not in proc.stdout, proc.stdout

    header, rows = _table(proc.stdout)
    assert header == list(bench_hook_sweep.SUMMARY_COLUMNS)
    assert [row[:2] for row in rows] == [["plain", "2-block MLP w64"], ["plain", "tiny Llama, 2 layers"]]
    for row in rows:
        assert len(row) == len(header)
        for name, cell in zip(header[2:], row[2:], strict=True):
            assert NUMBER.search(cell), (name, cell)
            assert "nan" not in cell.lower(), (name, cell)

    # the per-configuration block: every figure the issue asks for, for each arm
    block = [line.strip() for line in proc.stdout.splitlines() if line.startswith("  ")]
    for label in (
        "step median",
        "unsampled CPU",
        "unsampled extra",
        "all-in amortized",
        "all-in measured",
        "p99 / max step",
        "first steps extra",
        "gc per 1000 steps (gen 0/1/2)",
        "process CPU",
    ):
        found = [line for line in block if line.startswith(label)]
        assert len(found) == 2, label
        assert all(NUMBER.search(line.split(":", 1)[1]) for line in found), found

    payload = json.loads(out.read_text())
    results = payload["results"]
    assert len(results) == 2
    assert f"all on CPU {CPU}" in proc.stdout.splitlines()[0]
    for res in results:
        assert res["rounds"] == 3 and res["cpu"] == CPU
        for key in (
            "step_ms",
            "extra_unsampled_us",
            "control_unsampled_us",
            "extra_unsampled_cpu_us",
            "control_unsampled_cpu_us",
            "all_in_amortized",
            "control_all_in_amortized",
            "all_in_measured",
            "control_all_in_measured",
            "step0_extra_ms",
            "step1_extra_ms",
            "process_cpu_ratio",
        ):
            assert isinstance(res[key], float) and math.isfinite(res[key]), key
        for arm in bench_hook_sweep.ARMS:
            stats = res["arms"][arm]
            assert stats["p99_ms"] <= stats["max_ms"]
            assert len(stats["gc_per_1000"]) == 3
