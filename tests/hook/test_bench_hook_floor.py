"""benchmarks/bench_hook_floor.py runs end to end on its smallest configuration and prints every arm.

Shape only, never timing: a few rounds, one process per arm, not pinned."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smallest_configuration_prints_every_arm() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_hook_floor.py"),
            *("--rounds", "3", "--warmup", "2", "--procs", "1", "--cpu", "-1"),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("hook floor: 2-block MLP, 3 rounds, 1 processes per arm, not pinned"), lines
    arms = [
        re.match(r"\s+(\w+)\s+step\s+([\d.]+) µs\s+extra\s+([+-][\d.]+) µs\s+per process ([+-]\d+)", line)
        for line in lines[1:]
    ]
    assert [m.group(1) for m in arms if m] == ["plain", "context", "idle", "hooked"], lines
    plain = next(m for m in arms if m and m.group(1) == "plain")
    assert float(plain.group(3)) == 0.0 and float(plain.group(2)) > 0.0
