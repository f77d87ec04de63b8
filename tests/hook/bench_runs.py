"""Running a script of ``benchmarks/`` the way its smoke tests do: the checkout on the path, a time limit,
what it printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(script: str, *args: str, timeout_s: float = 300) -> list[str]:
    """The lines ``benchmarks/<script>`` printed with ``args``; fails the test where it did not exit 0."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()
