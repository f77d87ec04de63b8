"""benchmarks/bench_hook_versions.py: its figures from known step times, and one end-to-end run of its
smallest configuration (shape only, never timing: five worker processes, the do-nothing hooks' too, a few
rounds, on whatever load the machine has, the committed hook against the working tree's)."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_hook_versions  # noqa: E402


def test_the_extras_are_per_round_differences() -> None:
    plain = [100.0, 200.0, 300.0, 400.0, 500.0, 600.0]
    times = {
        "plain": plain,
        "control": list(plain),
        "base": [p + 50.0 for p in plain],
        "this": [p + 20.0 for p in plain],
    }
    res = bench_hook_versions.summarize(times, warmup=1)
    assert res["control"]["median"] == 0.0 and res["control"]["mean80"] == 0.0
    assert res["base"]["median"] == res["base"]["mean80"] == 50.0
    assert res["this"]["median"] == 20.0 and res["this"]["step"] == statistics.median(
        [p + 20 for p in plain[1:]]
    )
    assert res["this-base"]["median"] == res["this-base"]["q1"] == res["this-base"]["q3"] == -30.0
    assert "this-floor" not in res
    times[bench_hook_versions.FLOOR] = [p + 5.0 for p in plain]  # --floor: do-nothing hooks
    res = bench_hook_versions.summarize(times, warmup=1)
    assert res["floor"]["median"] == 5.0 and res["this-floor"]["median"] == 15.0


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("mlp", []),
        ("trainer", []),
        ("mlp", ["--told", "--accumulate", "2"]),
        ("trainer", ["--accumulate", "2"]),
        ("lightning", ["--accumulate", "2"]),
    ],
)
def test_smallest_configuration_prints_every_arm(model: str, extra: list[str]) -> None:
    """The loop of the working tree's README, and a Hugging Face Trainer run (its batches one per line on
    stdin, the loader a batch ahead, the run over when stdin closes); each also with two micro-batches a
    step (the loop's in a step block each, the Trainer's ``gradient_accumulation_steps``, Lightning's
    ``accumulate_grad_batches``)."""
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.fail("the benchmark compares with a git revision: run the tests in a clone")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_hook_versions.py"),
            "--models",
            model,
            "--depths",
            "1",
            "--rounds",
            "12",
            "--floor",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert f"{model} 1 on cpu, thread CPU:" in lines, proc.stdout
    assert not any("wall" in line for line in lines)  # (wall time: on a device, to its end of the step)
    for arm in (*bench_hook_versions.ARMS, bench_hook_versions.FLOOR):
        row = [line for line in lines if re.match(rf"\s+{arm}\s+step", line)]
        assert len(row) == 1, proc.stdout
        figures = r"step\s+\d+\.\d µs\s+extra\s+[+-]\d+\.\d µs \(IQR [+-]\d+\.\.[+-]\d+"
        assert re.search(figures, row[0]), row[0]
    for other in ("base", "floor"):
        assert any(re.match(rf"\s+this − {other}, per round: [+-]\d+\.\d µs", line) for line in lines), (
            proc.stdout
        )
