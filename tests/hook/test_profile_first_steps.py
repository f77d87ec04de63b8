"""benchmarks/profile_first_steps.py runs end to end on the CPU and prints each first step and the worst one's
profile. Shape only, never timing."""

from __future__ import annotations

import re

from tests.hook.bench_runs import run_benchmark


def test_each_first_step_and_the_worst_ones_profile_are_printed() -> None:
    out = "\n".join(run_benchmark("profile_first_steps.py", "--steps", "3", "--top", "5")) + "\n"
    assert re.search(r"2-block MLP on cpu: the usual plain step \d+\.\d+ ms", out), out
    steps = re.findall(
        r"step (\d): plain +\d+\.\d+ ms, hooked +\d+\.\d+ ms, extra +[+-]\d+\.\d+ usual steps", out
    )
    assert steps == ["0", "1", "2"], out
    worst = re.search(r"cProfile of the hooked process's step (\d), by cumulative time:", out)
    assert worst is not None and worst.group(1) in steps, out
    assert "function calls" in out.split(worst.group(0))[1], out  # (cProfile's own header)


def test_rounds_against_a_revision_print_each_steps_median_for_both_hooks() -> None:
    """``--rounds`` with ``--base``: fresh processes each round, every first step's median extra for the
    working tree's hook and the revision's, this − base per round, and the most any step was held up."""
    out = "\n".join(
        run_benchmark(
            "profile_first_steps.py", "--steps", "3", "--rounds", "1", "--base", "HEAD", "--no-profile"
        )
    )
    assert re.search(r"1 rounds of fresh processes \(plain, this, base\)", out), out
    num = r"[+-]\d+\.\d+"
    rows = re.findall(
        rf"step (\d): extra in usual steps, median \(range\): this +{num} \({num}\.\.{num}\), "
        rf"base +{num} \({num}\.\.{num}\), this − base +{num}",
        out,
    )
    assert rows == ["0", "1", "2"], out
    assert re.search(r"held up \(this\): median \d+\.\d+", out) and re.search(
        r"\(base\): median \d+\.\d+", out
    ), out
    assert "cProfile" not in out  # (--no-profile)


def test_a_deeper_mlp_is_asked_for_by_its_blocks() -> None:
    out = "\n".join(run_benchmark("profile_first_steps.py", "--blocks", "8", "--steps", "2", "--top", "3"))
    assert re.search(r"8-block MLP on cpu: the usual plain step \d+\.\d+ ms", out), out
