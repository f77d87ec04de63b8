"""benchmarks/bench_dispatch_floor.py runs end to end and prints every arm. Shape only, never timing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_arm_is_printed_with_its_ratio_and_cost_an_op() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_dispatch_floor.py"), "--rounds", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    head = re.search(r"2-block MLP on cpu: (\d+) ops a step, 3 interleaved rounds", proc.stdout)
    assert head is not None and int(head.group(1)) > 20, proc.stdout
    arms = re.findall(r"^  (.+?) +\d+\.\d{3} ms +\d+\.\d\dx +[+-]\d+\.\d µs an op$", proc.stdout, re.M)
    assert arms == ["plain", "nothing", "op groups", "memory trace"], proc.stdout
