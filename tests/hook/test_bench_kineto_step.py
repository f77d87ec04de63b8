"""benchmarks/bench_kineto_step.py runs end to end on the CPU and prints each arm. Shape only, never
timing."""

from __future__ import annotations

import re

from tests.hook.bench_runs import run_benchmark


def test_each_arm_prints_its_step_ratio_and_read() -> None:
    out = "\n".join(run_benchmark("bench_kineto_step.py", "--rounds", "2"))
    assert "2-block MLP, 2 interleaved rounds" in out, out
    for arm in ("plain", "kineto", "hook"):
        assert re.search(rf"{arm} +step +\d+\.\d+ ms \( *\d+\.\d+x plain\), read +\d+\.\d+ ms", out), out
