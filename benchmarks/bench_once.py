"""One snapshot, three tools: ``anatomy-top --once --json`` vs ``nvitop --once`` vs ``gpustat --json``.

Each tool runs as its own process under ``python -m tui.simnvml.run`` (so all three pay the same
start-up and see the same simulated box: 8 × H100, 64 compute processes backed by real local
PIDs), several rounds, interleaved with the order rotated each round. Printed: mean wall time,
mean CPU time of the child, NVML calls per snapshot, and ratios against nvitop measured in the
same run. Targets for anatomy-top: ≤ 0.7× nvitop's wall time and ≤ nvitop's NVML calls.
The "(floor)" row runs only the interpreter, the runner and ``import pynvml``: the fixed cost
inside every other row (the box is shared: CPU time is steadier than wall time).

    .venv/bin/python benchmarks/bench_once.py [--rounds 5] [--gpus 8] [--processes 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tui.simnvml import Scenario  # noqa: E402
from tui.simnvml.processes import sleepers  # noqa: E402

TOOLS: dict[str, list[str]] = {
    "nvitop": ["nvitop", "--once"],
    "gpustat": ["gpustat", "--json"],
    "anatomy-top": ["anatomy-top", "--once", "--json"],
    # Informational: the interpreter, the runner and `import pynvml` with no query at all, i.e.
    # the part of every row above that no tool can save.
    "(floor)": ["-m", "pynvml"],
}
BASELINE = "nvitop"
WALL_TARGET = 0.7
CALLS_TARGET = 1.0


@dataclass
class Samples:
    wall_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def available(name: str) -> str | None:
    """None when the tool can run, else why not."""
    if name.startswith("("):
        return None
    if not any(ep.name == name for ep in entry_points(group="console_scripts")):
        return f"console script {name!r} is not installed"
    if name == "anatomy-top":
        try:
            import tui.cli  # noqa: F401
        except ImportError as exc:
            return f"tui.cli cannot be imported yet ({exc})"
    return None


def run_once(
    command: list[str], scenario: Path, calls_path: Path, env: dict[str, str]
) -> tuple[float, float, int]:
    args = [
        sys.executable,
        "-m",
        "tui.simnvml.run",
        "--scenario",
        str(scenario),
        "--calls-out",
        str(calls_path),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run([*args, "--", *command], capture_output=True, text=True, env=env, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"exit {result.returncode}: {' | '.join(tail)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    calls = int(json.loads(calls_path.read_text())["total"])
    return wall, cpu, calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (after one warm-up round)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    tools = {}
    for name, command in TOOLS.items():
        why = available(name)
        if why:
            print(f"SKIP {name}: {why}")
        else:
            tools[name] = command
    if BASELINE not in tools:
        print(f"cannot benchmark without the baseline {BASELINE}")
        return 1

    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    env.pop("ANATOMY_TOP_SIMULATE", None)  # the runner installs the box; no second install
    samples = {name: Samples() for name in tools}
    with sleepers(args.processes) as pids, tempfile.TemporaryDirectory(prefix="bench-once-") as tmp:
        scenario = Path(tmp, "box.json")
        Scenario.demo_box(n_gpus=args.gpus, pids=pids).to_json(scenario)
        names = list(tools)
        for round_index in range(args.rounds + 1):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                try:
                    wall, cpu, count = run_once(tools[name], scenario, Path(tmp, f"{name}.json"), env)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    samples[name].failures.append(str(exc))
                    continue
                if round_index == 0:
                    continue  # warm-up: page cache, .pyc files
                samples[name].wall_s.append(wall)
                samples[name].cpu_s.append(cpu)
                samples[name].calls.append(count)

    base = samples[BASELINE]
    if not base.wall_s:
        print(f"baseline {BASELINE} failed: {base.failures[:1]}")
        return 1
    base_wall, base_cpu = statistics.mean(base.wall_s), statistics.mean(base.cpu_s)
    base_calls = float(statistics.mean(base.calls))
    print(f"\n{args.gpus} simulated GPUs, {args.processes} processes, {args.rounds} rounds (+1 warm-up)")
    header = (
        f"{'tool':<12} {'wall s':>8} {'±sd':>6} {'cpu s':>7} {'NVML calls':>10} "
        f"{'wall×':>7} {'cpu×':>6} {'calls×':>7}"
    )
    print(header)
    print("-" * len(header))
    report: dict[str, dict[str, object]] = {}
    for name, s in samples.items():
        if not s.wall_s:
            print(f"{name:<12} FAILED: {s.failures[:1]}")
            report[name] = {"failures": s.failures}
            continue
        wall, cpu = statistics.mean(s.wall_s), statistics.mean(s.cpu_s)
        calls = float(statistics.mean(s.calls))
        sd = statistics.stdev(s.wall_s) if len(s.wall_s) > 1 else 0.0
        ratios = (wall / base_wall, cpu / base_cpu, calls / base_calls)
        print(
            f"{name:<12} {wall:8.3f} {sd:6.3f} {cpu:7.3f} {calls:10.0f} "
            f"{ratios[0]:6.2f}× {ratios[1]:5.2f}× {ratios[2]:6.2f}×"
        )
        report[name] = {
            "wall_s": wall,
            "wall_sd_s": sd,
            "cpu_s": cpu,
            "nvml_calls": calls,
            "wall_ratio": ratios[0],
            "cpu_ratio": ratios[1],
            "calls_ratio": ratios[2],
            "failures": s.failures,
        }
    ours = report.get("anatomy-top")
    if ours and "wall_ratio" in ours:
        wall_ok = float(ours["wall_ratio"]) <= WALL_TARGET  # type: ignore[arg-type]
        calls_ok = float(ours["calls_ratio"]) <= CALLS_TARGET  # type: ignore[arg-type]
        print(
            f"\nanatomy-top targets: wall ≤ {WALL_TARGET}× nvitop: {'MET' if wall_ok else 'MISSED'}; "
            f"NVML calls ≤ nvitop's: {'MET' if calls_ok else 'MISSED'}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
