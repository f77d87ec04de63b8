"""One snapshot, three tools: ``anatomy-top --once --json`` vs ``nvitop --once`` vs ``gpustat --json``.

Each tool runs as its own process under ``python -m tui.simnvml.run`` (so all of them pay the same
start-up and see the same simulated box: 8 × H100, 64 compute processes backed by real local PIDs).
Rounds are interleaved, the order rotated each round, after one warm-up round.

Byte-code: every child runs with byte-code caching on (``PYTHONDONTWRITEBYTECODE`` removed) and one
private ``PYTHONPYCACHEPREFIX`` for all tools, so after the warm-up round nobody compiles source —
as on an installed machine. (With the variable set, our first-party modules, and the runner's, were
compiled on every run while nvitop's came from its installed ``.pyc`` files.)

Printed per tool: median and min wall time, median CPU time of the child, NVML calls per snapshot,
and ratios against nvitop from the same run: of the medians, the median of the per-round ratios
(robust to load that drifts over the run), and "above floor" — the tool's own cost once the
"(floor)" row is subtracted. The floor runs only the interpreter, the runner and ``import pynvml``:
the fixed cost inside every other row. MET / NOT MET comes from the medians.

The runner preloads what the simulation needs (dataclasses, json, ...), which every tool under it then
gets for free; so an informational second table runs nvitop and anatomy-top directly, with no runner
and no simulation (on a machine without a driver: start-up and imports, then a failed nvmlInit).

    .venv/bin/python benchmarks/bench_once.py [--rounds 15] [--gpus 8] [--processes 64]
        [--skip gpustat] [--no-direct] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tui.simnvml import Scenario  # noqa: E402
from tui.simnvml.processes import sleepers  # noqa: E402

TOOLS: dict[str, list[str]] = {
    "nvitop": ["nvitop", "--once"],
    "gpustat": ["gpustat", "--json"],
    "anatomy-top": ["anatomy-top", "--once", "--json"],
    # The interpreter, the runner and `import pynvml` with no query at all: the part of every row
    # above that no tool can save.
    "(floor)": ["-m", "pynvml"],
}
# Informational: the same tools run directly (no runner, no simulation): on this machine that is
# "no NVIDIA driver" — nvitop exits 1 after its imports and a failed nvmlInit, anatomy-top prints the
# host — so what it compares is real start-up: interpreter, site, every import, with nothing preloaded
# by the runner (which loads dataclasses, json, typing... for all tools under it).
DIRECT: dict[str, list[str]] = {
    "nvitop": ["nvitop", "--once"],
    "anatomy-top": ["anatomy-top", "--once", "--json"],
    "(floor)": ["-c", "import pynvml"],
}
BASELINE = "nvitop"
OURS = "anatomy-top"
FLOOR = "(floor)"
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
    if shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name):
        return None
    return f"console script {name!r} is not installed"


def child_env(pycache: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "PYTHONPYCACHEPREFIX": str(pycache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for key in [k for k in env if k.startswith("ANATOMY_TOP")]:
        env.pop(key)  # the runner installs the box; no second install, no training sockets
    env["ANATOMY_TOP_DIR"] = str(pycache.parent / "no-training")
    return env


def run_tool(
    command: list[str], scenario: Path, calls_path: Path, env: dict[str, str]
) -> tuple[float, float, int]:
    args = [sys.executable, "-m", "tui.simnvml.run", "--scenario", str(scenario)]
    args += ["--calls-out", str(calls_path), "--", *command]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"exit {result.returncode}: {' | '.join(tail)}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    calls = int(json.loads(calls_path.read_text())["total"])
    return wall, cpu, calls


def run_direct(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU time of one direct run (any exit status: without a driver nvitop exits 1)."""
    program = (
        [sys.executable, *command] if command[0].startswith("-") else [_script(command[0]), *command[1:]]
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(program, capture_output=True, env=env, timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _script(name: str) -> str:
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name) or name


def measure_direct(rounds: int) -> dict[str, Samples]:
    samples = {name: Samples() for name in DIRECT if name.startswith("(") or not available(name)}
    with tempfile.TemporaryDirectory(prefix="bench-once-direct-") as tmp:
        env = child_env(Path(tmp, "pycache"))
        names = list(samples)
        for round_index in range(rounds + 1):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                wall, cpu = run_direct(DIRECT[name], env)
                if round_index:
                    samples[name].wall_s.append(wall)
                    samples[name].cpu_s.append(cpu)
                    samples[name].calls.append(0)
    return samples


def measure(tools: dict[str, list[str]], rounds: int, gpus: int, processes: int) -> dict[str, Samples]:
    samples = {name: Samples() for name in tools}
    with sleepers(processes) as pids, tempfile.TemporaryDirectory(prefix="bench-once-") as tmp:
        scenario = Path(tmp, "box.json")
        Scenario.demo_box(n_gpus=gpus, pids=pids).to_json(scenario)
        env = child_env(Path(tmp, "pycache"))
        names = list(tools)
        for round_index in range(rounds + 1):
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                try:
                    wall, cpu, count = run_tool(tools[name], scenario, Path(tmp, "calls.json"), env)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    samples[name].failures.append(str(exc))
                    continue
                if round_index == 0:
                    continue  # warm-up: page cache, byte-code
                samples[name].wall_s.append(wall)
                samples[name].cpu_s.append(cpu)
                samples[name].calls.append(count)
    return samples


def paired_ratio(ours: list[float], base: list[float]) -> float:
    """Median over rounds of ours/base within the same round (both lists in round order)."""
    return statistics.median(a / b for a, b in zip(ours, base, strict=False) if b > 0)


def summarize(samples: dict[str, Samples]) -> dict[str, dict[str, object]]:
    base = samples[BASELINE]
    floor = samples.get(FLOOR)
    base_wall = statistics.median(base.wall_s)
    base_cpu = statistics.median(base.cpu_s)
    base_calls = statistics.median(base.calls)
    floor_wall = statistics.median(floor.wall_s) if floor and floor.wall_s else None
    report: dict[str, dict[str, object]] = {}
    for name, s in samples.items():
        if not s.wall_s:
            report[name] = {"failures": s.failures}
            continue
        wall, cpu, calls = statistics.median(s.wall_s), statistics.median(s.cpu_s), statistics.median(s.calls)
        row: dict[str, object] = {
            "wall_median_s": wall,
            "wall_min_s": min(s.wall_s),
            "cpu_median_s": cpu,
            "nvml_calls": calls,
            "wall_ratio": wall / base_wall,
            "wall_ratio_paired": paired_ratio(s.wall_s, base.wall_s),
            "cpu_ratio": cpu / base_cpu,
            "calls_ratio": calls / base_calls if base_calls else None,
            "rounds": len(s.wall_s),
            "failures": s.failures,
        }
        if floor_wall is not None and name != FLOOR and base_wall > floor_wall:
            row["above_floor_s"] = wall - floor_wall
            row["above_floor_ratio"] = (wall - floor_wall) / (base_wall - floor_wall)
        report[name] = row
    return report


def print_report(report: dict[str, dict[str, object]], args: argparse.Namespace) -> bool:
    print(
        f"\n{args.gpus} simulated GPUs, {args.processes} processes, {args.rounds} rounds (+1 warm-up); "
        f"ratios against {BASELINE} from this run"
    )
    header = (
        f"{'tool':<12} {'wall med':>9} {'wall min':>9} {'cpu med':>8} {'calls':>6} "
        f"{'wall×':>6} {'paired×':>8} {'cpu×':>6} {'calls×':>7} {'above floor':>15}"
    )
    print(header)
    print("-" * len(header))
    for name, r in report.items():
        if "wall_median_s" not in r:
            print(f"{name:<12} FAILED: {r['failures'][:1]}")  # type: ignore[index]
            continue
        f = {k: float(v) for k, v in r.items() if isinstance(v, (int, float))}
        above = (
            f"{1000 * f['above_floor_s']:6.1f}ms {f['above_floor_ratio']:5.2f}×"
            if "above_floor_s" in f
            else ""
        )
        calls_ratio = f"{f['calls_ratio']:6.2f}×" if "calls_ratio" in f else "   n/a"
        print(
            f"{name:<12} {f['wall_median_s']:9.3f} {f['wall_min_s']:9.3f} {f['cpu_median_s']:8.3f} "
            f"{f['nvml_calls']:6.0f} {f['wall_ratio']:5.2f}× {f['wall_ratio_paired']:7.2f}× "
            f"{f['cpu_ratio']:5.2f}× {calls_ratio:>7} {above:>15}"
        )
        if r.get("failures"):
            print(f"{'':<12} {len(r['failures'])} failed run(s), first: {r['failures'][0]}")  # type: ignore[index]
    ours = report.get(OURS, {})
    if "wall_ratio" not in ours:
        print(f"\n{OURS}: NOT MEASURED")
        return False
    wall_ok = float(ours["wall_ratio"]) <= WALL_TARGET  # type: ignore[arg-type]
    calls_ok = float(ours["calls_ratio"]) <= CALLS_TARGET  # type: ignore[arg-type]
    print(
        f"\n{OURS} target: median wall ≤ {WALL_TARGET}× {BASELINE}'s: {float(ours['wall_ratio']):.2f}× "  # type: ignore[arg-type]
        f"→ {'MET' if wall_ok else 'NOT MET'}"
    )
    print(
        f"{OURS} target: NVML calls ≤ {BASELINE}'s: {float(ours['nvml_calls']):.0f} vs "  # type: ignore[arg-type]
        f"{float(report[BASELINE]['nvml_calls']):.0f} → {'MET' if calls_ok else 'NOT MET'}"  # type: ignore[arg-type]
    )
    return wall_ok and calls_ok


def print_direct(report: dict[str, dict[str, object]]) -> None:
    print(
        "\ninformational: run directly, no runner (no driver here: real start-up and imports; "
        "nvitop exits 1 after nvmlInit fails)"
    )
    for name, r in report.items():
        f = {k: float(v) for k, v in r.items() if isinstance(v, (int, float))}
        above = f"   above floor {1000 * f['above_floor_s']:6.1f} ms" if "above_floor_s" in f else ""
        print(
            f"{name:<12} wall med {f['wall_median_s']:.3f} s  min {f['wall_min_s']:.3f} s  "
            f"{f['wall_ratio']:5.2f}× {BASELINE}{above}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="measured rounds (after one warm-up round)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--skip", action="append", default=[], help="leave a tool out (e.g. gpustat)")
    parser.add_argument("--no-direct", action="store_true", help="skip the informational direct runs")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    tools = {}
    for name, command in TOOLS.items():
        why = "--skip" if name in args.skip else available(name)
        if why:
            print(f"SKIP {name}: {why}")
        else:
            tools[name] = command
    if BASELINE not in tools:
        print(f"cannot benchmark without the baseline {BASELINE}")
        return 1
    samples = measure(tools, args.rounds, args.gpus, args.processes)
    if not samples[BASELINE].wall_s:
        print(f"baseline {BASELINE} failed: {samples[BASELINE].failures[:1]}")
        return 1
    report = summarize(samples)
    print_report(report, args)
    direct: dict[str, dict[str, object]] = {}
    if not args.no_direct:
        direct = summarize(measure_direct(args.rounds))
        print_direct(direct)
    if args.json:
        doc = {"under_runner": report, "direct": direct}
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
