"""anatomy-top's interactive monitor vs nvitop's, in real terminals (tmux), on the same simulated box.

One run: a simulated 8-GPU box with 64 real local processes on it; each tool in its own tmux server and
session of the same size. Measures
  - time to first frame: from spawning the session until ``capture-pane`` shows the box's driver version
    and a GPU process's PID (repetitions interleaved between the tools). anatomy-top draws that frame
    from its first NVML read before it loads Textual (tui/first_frame.py);
  - time to the interactive frame (anatomy-top only): until its key bar is on screen, i.e. Textual has
    taken over and keys work (nvitop's first frame is already interactive);
  - CPU seconds per minute: user+system CPU time of the tool's process tree (psutil) over a fixed window
    after a warm-up; the tmux server's own CPU (drawing what the tool writes) is printed beside it.
    anatomy-top is measured at its default refresh and at 1 s, each against nvitop at the same interval.
Prints each figure and its ratio to nvitop's. Targets: CPU ≤ 0.5× nvitop's, first frame ≤ nvitop's.

    .venv/bin/python benchmarks/bench_tui.py [--window 25] [--reps 5] [--processes 64] [--first-frame-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tui.demo import SLEEPERS, spawn_sleepers, stop_processes  # noqa: E402
from tui.intervals import DEFAULT_INTERVAL  # noqa: E402
from tui.simnvml.curves import Curve  # noqa: E402
from tui.simnvml.scenario import Scenario  # noqa: E402

WIDTH, HEIGHT = 160, 50
KEY_BAR = " q  Quit "  # anatomy-top's bottom line: on screen once Textual has taken over
FIRST_FRAME_TIMEOUT_S = 20.0
NVITOP_DEFAULT_S = 2.0
WARMUP_S = 3.0


@dataclass
class Tool:
    name: str
    argv: list[str]


class TmuxSession:
    def __init__(self, tag: str) -> None:
        self.socket = f"bench-tui-{os.getpid()}-{tag}"

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True, text=True, timeout=10
        )

    def start(self, command: str) -> None:
        done = self.tmux("new-session", "-d", "-s", "b", "-x", str(WIDTH), "-y", str(HEIGHT), command)
        if done.returncode != 0:
            raise RuntimeError(f"tmux new-session failed: {done.stderr.strip()}")

    def capture(self) -> str:
        done = self.tmux("capture-pane", "-p", "-t", "b")
        return done.stdout if done.returncode == 0 else ""

    def pane_pid(self) -> int:
        return int(self.tmux("display-message", "-p", "-t", "b", "#{pane_pid}").stdout.strip())

    def server_pid(self) -> int:
        return int(self.tmux("display-message", "-p", "#{pid}").stdout.strip())

    def kill(self) -> None:
        self.tmux("kill-server")


def shell_command(tool: Tool, env: dict[str, str]) -> str:
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    # exec: the pane's process is the tool itself, so its process tree is exactly the tool's.
    # COLUMNS/LINES can leak in from the tmux server's environment and override the pane's real size.
    unset = "-u COLUMNS -u LINES"
    return f"cd {shlex.quote(str(REPO))} && exec env {unset} {assignments} {shlex.join(tool.argv)}"


def first_frame(tool: Tool, env: dict[str, str], markers: list[str], tag: str) -> tuple[float, str]:
    session = TmuxSession(tag)
    try:
        t0 = time.perf_counter()
        session.start(shell_command(tool, env))
        screen = ""
        while time.perf_counter() - t0 < FIRST_FRAME_TIMEOUT_S:
            screen = session.capture()
            if all(m in screen for m in markers):
                return time.perf_counter() - t0, screen
            time.sleep(0.005)
        raise RuntimeError(
            f"{tool.name}: no first frame within {FIRST_FRAME_TIMEOUT_S:.0f} s; screen:\n{screen}"
        )
    finally:
        session.kill()


def _tree_cpu(root: psutil.Process) -> dict[int, float]:
    out: dict[int, float] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            out[proc.pid] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return out


def _cpu(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def cpu_per_minute(
    tool: Tool, env: dict[str, str], markers: list[str], window_s: float, tag: str
) -> tuple[float, float]:
    """(tool tree CPU s/min, tmux server CPU s/min) over ``window_s`` after the first frame and a warm-up."""
    session = TmuxSession(tag)
    try:
        session.start(shell_command(tool, env))
        deadline = time.monotonic() + FIRST_FRAME_TIMEOUT_S
        while not all(m in session.capture() for m in markers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tool.name}: no first frame")
            time.sleep(0.05)
        time.sleep(WARMUP_S)
        root = psutil.Process(session.pane_pid())
        server = session.server_pid()
        before, server_before = _tree_cpu(root), _cpu(server)
        t0 = time.monotonic()
        time.sleep(window_s)
        after, server_after = _tree_cpu(root), _cpu(server)
        elapsed = time.monotonic() - t0
        if not root.is_running():
            raise RuntimeError(f"{tool.name} exited during the measurement")
        used = sum(after[pid] - before.get(pid, 0.0) for pid in after)
        return used / elapsed * 60.0, (server_after - server_before) / elapsed * 60.0
    finally:
        session.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--window", type=float, default=25.0, help="CPU measurement window per tool, seconds")
    parser.add_argument("--reps", type=int, default=5, help="first-frame repetitions per tool")
    parser.add_argument("--first-frame-only", action="store_true", help="skip the CPU measurement")
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        print("bench_tui: tmux is not installed", file=sys.stderr)
        return 2
    bindir = Path(sys.executable).parent
    anatomy_top = bindir / "anatomy-top"
    tools = [
        Tool(
            "anatomy-top", [str(anatomy_top)] if anatomy_top.exists() else [sys.executable, "-m", "tui.cli"]
        ),
        Tool("nvitop", []),  # argv filled in below: it needs the scenario path
    ]
    if shutil.which("nvitop", path=str(bindir)) is None and shutil.which("nvitop") is None:
        print("bench_tui: nvitop is not installed (dev extra)", file=sys.stderr)
        return 2

    workdir = Path(tempfile.mkdtemp(prefix="bench-tui-"))
    (workdir / "bin").mkdir()
    (workdir / "run").mkdir(mode=0o700)  # an empty runtime dir: no hooks publish in this benchmark
    commands = [SLEEPERS[i % len(SLEEPERS)][0] for i in range(args.processes)]
    sleepers = spawn_sleepers(commands, workdir / "bin")
    try:
        pids = [p.pid for p in sleepers]
        scenario = Scenario.demo_box(n_gpus=args.gpus, pids=pids)
        # The marker process: on GPU 0 and the largest, so it is on the first screen of both tools.
        first = scenario.processes[0]
        scenario.processes[0] = dataclasses.replace(first, used_memory=Curve.constant(76 * 1024**3))
        scenario_path = workdir / "scenario.json"
        scenario.to_json(scenario_path)
        tools[1].argv = [
            sys.executable,
            "-m",
            "tui.simnvml.run",
            "--scenario",
            str(scenario_path),
            "--",
            "nvitop",
        ]
        env = {
            "ANATOMY_TOP_SIMULATE": str(scenario_path),
            "ANATOMY_TOP_DIR": str(workdir / "run"),
            "TERM": "xterm-256color",
        }
        # Both tools show the driver version in their header and the PIDs in their process table.
        markers = [scenario.driver_version, str(pids[0])]
        print(
            f"bench_tui: {args.gpus} simulated GPUs, {args.processes} processes, tmux {WIDTH}x{HEIGHT}, "
            f"{psutil.cpu_count()} CPUs; first frame x{args.reps} interleaved, CPU window {args.window:g} s"
        )
        ours, theirs = tools
        # (ours, the nvitop run it is compared with): defaults first, then the same interval.
        pairs: list[tuple[Tool, Tool]] = [(ours, theirs)]
        at_1s = Tool("nvitop --interval 1", [*theirs.argv, "--interval", "1"])
        pairs.append((Tool("anatomy-top --interval 1", [*ours.argv, "--interval", "1"]), at_1s))
        if DEFAULT_INTERVAL != NVITOP_DEFAULT_S:
            pairs.append((Tool("anatomy-top --interval 2", [*ours.argv, "--interval", "2"]), theirs))
        frames: dict[str, list[float]] = {t.name: [] for t in tools}
        interactive: list[float] = []
        for rep in range(args.reps):
            for tool in tools:
                seconds, _ = first_frame(tool, env, markers, f"ff{rep}-{tool.name}")
                frames[tool.name].append(seconds)
            seconds, _ = first_frame(ours, env, [*markers, KEY_BAR], f"if{rep}")
            interactive.append(seconds)
        cpu: dict[str, tuple[float, float]] = {}
        for pair in [] if args.first_frame_only else pairs:
            for tool in pair:
                if tool.name not in cpu:
                    cpu[tool.name] = cpu_per_minute(tool, env, markers, args.window, f"cpu-{len(cpu)}")
    finally:
        stop_processes(sleepers)
        shutil.rmtree(workdir, ignore_errors=True)

    base_ff = statistics.median(frames["nvitop"])
    ours_ff = statistics.median(frames["anatomy-top"])
    ours_if = statistics.median(interactive)
    print(
        f"first frame (median of {args.reps}): anatomy-top {ours_ff:.3f} s, nvitop {base_ff:.3f} s, "
        f"ratio {ours_ff / base_ff:.2f}"
    )
    print(
        f"anatomy-top interactive frame (key bar on screen): {ours_if:.3f} s, {ours_if / base_ff:.2f}x "
        "nvitop's first frame"
    )
    print("  anatomy-top interactive frames: " + ", ".join(f"{s:.3f}" for s in interactive))
    for tool in tools:
        print(f"  {tool.name} first frames: " + ", ".join(f"{s:.3f}" for s in frames[tool.name]))
    if args.first_frame_only:
        verdict = "OK" if ours_ff <= base_ff else "MISSED"
        print(f"target: first frame <= nvitop's: {ours_ff / base_ff:.2f}x {verdict}")
        return 0
    print(f"anatomy-top's default refresh: {DEFAULT_INTERVAL:g} s; nvitop's: {NVITOP_DEFAULT_S:g} s")
    print(
        f"{'tool':<28}{'first frame':>12}{'ratio':>8}{'CPU s/min':>12}{'ratio':>8}"
        f"{'tmux CPU s/min':>16}  compared with"
    )
    printed: set[str] = set()
    for pair in pairs:
        base_cpu = cpu[pair[1].name][0]
        for tool in pair:
            if tool.name in printed:
                continue
            printed.add(tool.name)
            tree, server = cpu[tool.name]
            ratio_cpu = tree / base_cpu if base_cpu > 0 else float("nan")
            if tool.name in frames:
                ff = statistics.median(frames[tool.name])
                ff_cells = f"{ff:>10.3f} s{ff / base_ff:>8.2f}"
            else:
                ff_cells = f"{'':>20}"
            against = pair[1].name if tool is pair[0] else ""
            print(f"{tool.name:<28}{ff_cells}{tree:>12.2f}{ratio_cpu:>8.2f}{server:>16.2f}  {against}")
    base_cpu = cpu["nvitop"][0]
    ours_cpu = cpu["anatomy-top"][0] / base_cpu if base_cpu > 0 else float("nan")
    print(
        f"targets: CPU <= 0.50x nvitop: {ours_cpu:.2f}x {'OK' if ours_cpu <= 0.5 else 'MISSED'}; "
        f"first frame <= nvitop's: {ours_ff / base_ff:.2f}x {'OK' if ours_ff <= base_ff else 'MISSED'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
