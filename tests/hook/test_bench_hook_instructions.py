"""benchmarks/bench_hook_instructions.py: its worker, run without valgrind, steps every arm and says how many
steps rested; its counts come from valgrind's own summary line.

Shape only, never timing or counts of a real valgrind run (the box that runs the tests may have none)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hook.bench_runs import ROOT, run_benchmark

sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_hook_instructions as bench


@pytest.mark.parametrize("arm", ["plain", "import", "hooked", "unrecorded", "quiet"])
def test_worker_steps_every_arm_and_counts_the_resting_steps(arm: str) -> None:
    lines = run_benchmark("bench_hook_instructions.py", "--worker", arm, "mlp", "2", "12", "3600")
    found = re.fullmatch(r"rested (\d+) threads (\d+) median_s (\S+)", lines[-1])
    assert found is not None, lines
    rested, threads, median_s = int(found.group(1)), int(found.group(2)), float(found.group(3))
    assert median_s > 0.0
    # the publisher's thread runs where the hook publishes; the quiet arm is the training thread alone
    assert threads == (2 if arm in ("hooked", "unrecorded") else 1)
    if arm in ("plain", "import"):
        assert rested == 0
    else:  # the first steps are watched in full (the first sums, the sampled ones); the rest rest
        assert 5 <= rested < 12


def test_count_reads_valgrinds_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(
            cmd,
            0,
            stdout="rested 37 median_s 0.001\n",
            stderr="==1== \n==1== I   refs:      10,303,809,139\n",
        )

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    assert bench._count("hooked", "mlp", 2, 52, 3600.0) == (10_303_809_139, 37)
    assert seen[0][:2] == ["valgrind", "--tool=cachegrind"]
    assert seen[0][seen[0].index("--worker") :] == ["--worker", "hooked", "mlp", "2", "52", "3600.0"]


def test_count_fails_loudly_without_a_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        bench.subprocess,
        "run",
        lambda cmd, **kwargs: subprocess.CompletedProcess(cmd, 0, stdout="", stderr="valgrind: no such tool"),
    )
    with pytest.raises(RuntimeError, match="no count"):
        bench._count("plain", "mlp", 2, 12, 3600.0)


def test_module_lives_in_benchmarks() -> None:
    assert Path(bench.__file__).resolve().parent == ROOT / "benchmarks"
