"""benchmarks/bench_grad_probe.py runs end to end on the CPU and prints both arms per model. Shape only,
never timing."""

from __future__ import annotations

import re

from tests.hook.bench_runs import run_benchmark


def test_both_arms_print_their_traced_step_reads_and_stride() -> None:
    out = "\n".join(run_benchmark("bench_grad_probe.py", "--layers", "2", "--rounds", "2"))
    assert re.search(r"tiny Llama, 2 layers \(\d+ parameters\), 2 interleaved rounds:", out), out
    assert re.search(r"plain step +\d+\.\d ms", out), out
    for arm in ("not told", "told"):
        assert re.search(rf"traced, watch {arm} +\d+\.\d ms, \d+ reads, stride \d+", out), out
