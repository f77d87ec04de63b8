"""benchmarks/bench_step_cost.py runs end to end on its smallest configuration and prints every line.

Shape only, never timing: a 2-block MLP, a few rounds, on whatever load the machine has; accelerate's loop
shape (four ``tracker.step()`` blocks per update), which runs every line of the default loop's too.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"([+-]?\d+(?:\.\d+)?)"
ROUNDS = 5


def test_smallest_configuration_prints_every_figure() -> None:
    loop = "micro"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_step_cost.py"),
            "--rounds",
            str(ROUNDS),
            "--blocks",
            "2",
            "--loop",
            loop,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 6, proc.stdout
    # (none of the measured rounds is a sampled step: all of them count)
    head = f"2-block MLP (width 16, batch 4), loop={loop}, steps told their samples, {ROUNDS} rounds"
    assert lines[0] == head
    for line, arm in zip(lines[1:4], ("plain", "control", "hooked"), strict=True):
        found = re.fullmatch(rf"  {arm} +median step +{NUMBER} µs", line)
        assert found, line
        assert float(found.group(1)) > 0
    for line, clock in zip(lines[4:], ("wall clock", "training thread CPU"), strict=True):
        found = re.fullmatch(
            rf"  hook cost per step: +{NUMBER} µs +\(A/A control: {NUMBER} µs\) +{clock}", line
        )
        assert found, line
        assert all(math.isfinite(float(v)) for v in found.groups())
