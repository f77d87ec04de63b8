"""benchmarks/profile_first_steps.py runs end to end on the CPU and prints each first step and the worst one's
profile. Shape only, never timing."""

from __future__ import annotations

import re

from tests.hook.bench_runs import run_benchmark


def test_each_first_step_and_the_worst_ones_profile_are_printed() -> None:
    out = "\n".join(run_benchmark("profile_first_steps.py", "--steps", "3", "--top", "5")) + "\n"
    assert re.search(r"the usual plain step \d+\.\d+ ms", out), out
    steps = re.findall(
        r"step (\d): plain +\d+\.\d+ ms, hooked +\d+\.\d+ ms, extra +[+-]\d+\.\d+ usual steps", out
    )
    assert steps == ["0", "1", "2"], out
    worst = re.search(r"cProfile of the hooked process's step (\d), by cumulative time:", out)
    assert worst is not None and worst.group(1) in steps, out
    assert "function calls" in out.split(worst.group(0))[1], out  # (cProfile's own header)
