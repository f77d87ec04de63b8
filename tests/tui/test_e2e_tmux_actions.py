"""Process actions in a real terminal: anatomy-top in tmux against simulated GPUs that list real child
processes. T then enter on a child that ignores SIGTERM (it stays, the monitor says so), K then enter
(it dies), e shows a child's environment, t the tree, --only hides the other GPU's processes, q quits."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_e2e_tmux import monitor_command
from tmux_session import Tmux, wait_for

from tui.simnvml import Curve, Scenario, SimProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="the tmux binary is not installed"),
]
GiB = 1 << 30


@pytest.fixture
def children() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    procs = {
        "stubborn": subprocess.Popen(
            ["bash", "-c", "trap '' TERM; exec sleep 300"], stdin=subprocess.DEVNULL
        ),
        "plain": subprocess.Popen(
            ["sleep", "301"],
            stdin=subprocess.DEVNULL,
            env={"PATH": os.environ["PATH"], "ANATOMY_E2E": "hello"},
        ),
    }
    deadline = time.monotonic() + 10
    for proc in procs.values():
        while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "sleep":
            assert time.monotonic() < deadline
            time.sleep(0.01)
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def scenario_file(tmp_path: Path, procs: dict[str, subprocess.Popen[bytes]]) -> Path:
    scenario = Scenario.build(2, 0)
    scenario.processes = [
        # The stubborn one holds the most GPU memory: the first row, where the cursor starts.
        SimProcess(
            pid=procs["stubborn"].pid,
            gpu_index=0,
            used_memory=Curve.constant(9 * GiB),
            sm_util=Curve.constant(77),
            memory_util=Curve.constant(33),
        ),
        SimProcess(pid=procs["plain"].pid, gpu_index=1, used_memory=Curve.constant(2 * GiB)),
    ]
    path = tmp_path / "scenario.json"
    scenario.to_json(path)
    return path


def test_signals_environment_tree_in_a_real_terminal(
    tmp_path: Path, children: dict[str, subprocess.Popen[bytes]]
) -> None:
    stubborn, plain = children["stubborn"].pid, children["plain"].pid
    scenario = scenario_file(tmp_path, children)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    rc_file = tmp_path / "rc"
    tmux = Tmux("actions", 120, 40)
    try:
        tmux.start(monitor_command(scenario, runtime, rc_file))
        # The key bar is Textual's: the monitor reads keys from then on (the start-up frame comes earlier).
        needles = (str(stubborn), str(plain), " q  Quit ")
        assert wait_for(lambda: all(n in tmux.capture() for n in needles), 60), tmux.capture()
        row = next(line for line in tmux.capture().splitlines() if f" {stubborn} " in line)
        assert "77%" in row and "33%" in row, row  # SM % and memory-bandwidth % from the simulator

        tmux.keys("T")
        assert wait_for(lambda: f"Send a signal to PID {stubborn}?" in tmux.capture(), 10), tmux.capture()
        screen = tmux.capture()
        assert "SIGTERM" in screen and "SIGKILL" in screen and "sleep 300" in screen
        tmux.keys("Enter")
        assert wait_for(lambda: "sent SIGTERM" in tmux.capture(), 10), tmux.capture()
        assert wait_for(lambda: "still running" in tmux.capture(), 10), tmux.capture()
        assert children["stubborn"].poll() is None

        tmux.keys("K")
        assert wait_for(lambda: f"Send a signal to PID {stubborn}?" in tmux.capture(), 10), tmux.capture()
        tmux.keys("Enter")
        assert children["stubborn"].wait(timeout=10) == -signal.SIGKILL
        assert wait_for(lambda: "has exited" in tmux.capture(), 10), tmux.capture()

        tmux.keys("End", "e")  # the last row: the plain child
        assert wait_for(lambda: f"Environment of PID {plain}" in tmux.capture(), 10), tmux.capture()
        assert wait_for(lambda: "ANATOMY_E2E" in tmux.capture() and "hello" in tmux.capture(), 5)
        tmux.keys("Escape")  # alone: ESC then t at once reads as Alt+t
        assert wait_for(lambda: "Environment of PID" not in tmux.capture(), 10), tmux.capture()
        tmux.keys("t")
        assert wait_for(lambda: "Process tree" in tmux.capture() and "└─ sleep 301" in tmux.capture(), 15), (
            tmux.capture()
        )
        tmux.keys("Escape")
        assert wait_for(lambda: "Process tree" not in tmux.capture(), 10), tmux.capture()
        tmux.keys("q")
        assert wait_for(lambda: not tmux.alive(), 15), tmux.capture()
        assert wait_for(rc_file.exists, 5) and rc_file.read_text().strip() == "0"
    finally:
        tmux.kill()
    assert children["plain"].poll() is None  # nothing sent to what was only looked at


def test_only_hides_the_other_gpus(tmp_path: Path, children: dict[str, subprocess.Popen[bytes]]) -> None:
    stubborn, plain = children["stubborn"].pid, children["plain"].pid
    scenario = scenario_file(tmp_path, children)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    rc_file = tmp_path / "rc"
    tmux = Tmux("only", 120, 40)
    try:
        tmux.start(monitor_command(scenario, runtime, rc_file, args="--only 1"))
        needles = (str(plain), "only GPU 1", " q  Quit ")
        assert wait_for(lambda: all(n in tmux.capture() for n in needles), 60), tmux.capture()
        assert str(stubborn) not in tmux.capture()
        tmux.keys("q")
        assert wait_for(lambda: not tmux.alive(), 15), tmux.capture()
    finally:
        tmux.kill()
