"""benchmarks/bench_sampled_garbage.py runs end to end on the CPU and prints each arm's collections per
kind of step. Shape only, never counts."""

from __future__ import annotations

import re

from tests.hook.bench_runs import run_benchmark


def test_each_arm_prints_its_collections_by_kind_of_step() -> None:
    args = ("--layers", "8", "--steps", "6", "--rounds", "1", "--base", "HEAD")
    out = "\n".join(run_benchmark("bench_sampled_garbage.py", *args))
    assert "tiny Llama, 8 layers, 6 steps, 1 process(es) per arm" in out, out
    assert re.search(r"plain: all \d+/\d+/\d+; ordinary 6 steps", out), out
    for arm in ("this", "base"):
        line = re.search(rf"{arm} *: all \d+/\d+/\d+;.*", out)
        assert line is not None and "profile" in line.group(0), out  # (step 1 on: the profiler's pieces)
