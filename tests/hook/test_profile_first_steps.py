"""benchmarks/profile_first_steps.py runs end to end on the CPU and prints each first step and the worst one's
profile. Shape only, never timing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_each_first_step_and_the_worst_ones_profile_are_printed() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "profile_first_steps.py"), "--steps", "3", "--top", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert re.search(r"the usual plain step \d+\.\d+ ms", out), out
    steps = re.findall(
        r"step (\d): plain +\d+\.\d+ ms, hooked +\d+\.\d+ ms, extra +[+-]\d+\.\d+ usual steps", out
    )
    assert steps == ["0", "1", "2"], out
    worst = re.search(r"cProfile of the hooked process's step (\d), by cumulative time:", out)
    assert worst is not None and worst.group(1) in steps, out
    assert "function calls" in out.split(worst.group(0))[1], out  # (cProfile's own header)
