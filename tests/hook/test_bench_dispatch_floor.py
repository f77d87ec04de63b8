"""benchmarks/bench_dispatch_floor.py runs end to end and prints every arm. Shape only, never timing."""

from __future__ import annotations

import re

from tests.hook.bench_runs import run_benchmark


def test_every_arm_is_printed_with_its_ratio_and_cost_an_op() -> None:
    out = "\n".join(run_benchmark("bench_dispatch_floor.py", "--rounds", "3")) + "\n"
    head = re.search(r"2-block MLP on cpu: (\d+) ops a step, 3 interleaved rounds", out)
    assert head is not None and int(head.group(1)) > 20, out
    arms = re.findall(r"^  (.+?) +\d+\.\d{3} ms +\d+\.\d\dx +[+-]\d+\.\d µs an op$", out, re.M)
    assert arms == ["plain", "nothing", "op groups", "memory trace"], out
