"""benchmarks/bench_hook_floor.py runs end to end on its smallest configuration and prints every arm.

Shape only, never timing: a few rounds, one process per arm, not pinned."""

from __future__ import annotations

import re

from tests.hook.bench_runs import run_benchmark


def test_smallest_configuration_prints_every_arm() -> None:
    lines = run_benchmark(
        "bench_hook_floor.py", *("--rounds", "3", "--warmup", "2", "--procs", "1", "--cpu", "-1")
    )
    assert lines[0].startswith("hook floor: 2-block MLP, 3 rounds, 1 processes per arm, not pinned"), lines
    arms = [
        re.match(r"\s+(\w+)\s+step\s+([\d.]+) µs\s+extra\s+([+-][\d.]+) µs\s+per process ([+-]\d+)", line)
        for line in lines[1:]
    ]
    assert [m.group(1) for m in arms if m] == ["plain", "context", "idle", "hooked"], lines
    plain = next(m for m in arms if m and m.group(1) == "plain")
    assert float(plain.group(3)) == 0.0 and float(plain.group(2)) > 0.0


def test_the_parts_and_bursts_are_said_and_every_arm_printed() -> None:
    lines = run_benchmark(
        "bench_hook_floor.py",
        *("--rounds", "2", "--warmup", "1", "--procs", "1", "--cpu", "-1", "--part", "ours", "--burst", "3"),
    )
    assert lines[0].endswith("training-thread CPU of the context's entry and exit only, 3 steps a turn"), (
        lines
    )
    arms = [re.match(r"\s+(\w+)\s+step\s+([\d.]+) µs", line) for line in lines[1:]]
    assert [m.group(1) for m in arms if m] == ["plain", "context", "idle", "hooked"], lines
