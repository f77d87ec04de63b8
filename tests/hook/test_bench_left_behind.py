"""benchmarks/bench_left_behind.py runs end to end on a small configuration, prints every arm, and finds
nothing of ours left on the model the tracker watched (its traced steps included).

Shape and what is left only, never timing: a few rounds."""

from __future__ import annotations

import ast
import re

from tests.hook.bench_runs import run_benchmark


def test_a_closed_tracker_leaves_nothing_on_the_model_it_watched() -> None:
    lines = run_benchmark(
        "bench_left_behind.py", *("--blocks", "2", "--rounds", "5", "--warmup", "2", "--watched", "12")
    )
    assert lines[0].startswith("left behind: mlp, 2 blocks (8 parameters), 5 rounds"), lines
    arms = [re.match(r"\s+(\w+)\s+step\s+([\d.]+) µs\s+extra\s+([+-][\d.]+) µs", line) for line in lines[1:4]]
    assert [m.group(1) for m in arms if m] == ["plain", "control", "watched"], lines
    held = ast.literal_eval(lines[4].split("holds: ", 1)[1])
    assert held == {"post-accumulate-grad hook dicts": 0, "backward hook dicts": 0, "forward hooks": 0}
