"""End to end in a real terminal: a real CPU training process publishes through the hook, anatomy-top runs
in tmux against simulated GPUs with that PID on GPU 0, and the screen shows exactly the bytes the hook
measured. Then `?` opens the help, and `q` quits with exit code 0."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anatomy import protocol
from anatomy.protocol import Hello, Snapshot
from tui import format as fmt
from tui.sources.reconcile import reconcile

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="the tmux binary is not installed"),
]

REPO = Path(__file__).resolve().parents[2]
WIDTH, HEIGHT = 160, 50
# Frozen figures: a few steps, then the job keeps publishing its last snapshot (--linger).
TRAIN_ARGS = ["--steps", "3", "--linger", "--sample-every", "2", "--batch", "4", "--seq", "32"]
TRAIN_ARGS += ["--hidden", "128", "--layers", "2"]  # a light model: this test is about the figures
_BYTES = re.compile(r"-?\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB|PiB)\b")


class Tmux:
    """One private tmux server (its own socket) holding one session."""

    def __init__(self, name: str) -> None:
        self.socket = f"anatomy-e2e-{os.getpid()}-{name}"
        self.session = name

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=10,
        )

    def start(self, command: str) -> None:
        self._run("new-session", "-d", "-s", self.session, "-x", str(WIDTH), "-y", str(HEIGHT), command)

    def capture(self) -> str:
        done = self._run("capture-pane", "-p", "-t", self.session, check=False)
        return done.stdout if done.returncode == 0 else ""

    def alive(self) -> bool:
        return self._run("has-session", "-t", self.session, check=False).returncode == 0

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", self.session, *keys)

    def kill(self) -> None:
        self._run("kill-server", check=False)


def wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@pytest.fixture
def training(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    pytest.importorskip("torch")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    log = tmp_path / "train.log"
    env = dict(os.environ, ANATOMY_TOP_DIR=str(runtime))
    env.pop("ANATOMY_TOP", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tui.demo_train", *TRAIN_ARGS],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc, runtime, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def hook_snapshot(runtime: Path, pid: int, log: Path) -> tuple[Hello, Snapshot]:
    """The hook's own figures, read through the protocol once the job has done its last step."""
    done = wait_for(lambda: "lingering" in log.read_text(errors="replace"), 120, step=0.2)
    assert done, f"the training job did not finish its steps; its log:\n{log.read_text(errors='replace')}"
    path = runtime / protocol.socket_name(pid)
    with protocol.Reader(path) as reader:
        reader.wait(timeout=10)
        assert reader.hello is not None and reader.snapshot is not None
        return reader.hello, reader.snapshot


def monitor_command(scenario: Path, runtime: Path, rc_file: Path) -> str:
    script = Path(sys.executable).parent / "anatomy-top"
    exe = str(script) if script.exists() else f"{sys.executable} -m tui.cli"
    return (
        # COLUMNS/LINES leak in from the tmux server's environment and would override the pane's size
        f"cd {REPO} && env -u COLUMNS -u LINES ANATOMY_TOP_SIMULATE={scenario} ANATOMY_TOP_DIR={runtime} "
        "TERM=xterm-256color "
        f"{exe}; echo $? > {rc_file}"
    )


def on_one_line(screen: str, label: str, value: str) -> bool:
    return any(label in ln and value in ln for ln in screen.splitlines())


def row_figures(screen: str, label: str) -> list[str]:
    """The byte figures on the component row of ``label``, left to right (At peak, then Max in step)."""
    for ln in screen.splitlines():
        if label in ln:
            return _BYTES.findall(ln[ln.index(label) + len(label) :].split("│")[0])
    return []


def test_monitor_shows_the_hooks_bytes_and_quits_cleanly(tmp_path: Path, training) -> None:
    from tui.demo import build_scenario

    proc, runtime, log = training
    hello, snapshot = hook_snapshot(runtime, proc.pid, log)
    assert hello.pid == proc.pid and hello.device == "cpu"

    scenario = tmp_path / "scenario.json"
    build_scenario(proc.pid, [], n_gpus=2).to_json(scenario)
    # The hook's own figures, straight from its snapshot: the split at the peak and each maximum.
    assert snapshot.at_peak is not None and snapshot.peak_bytes is not None
    assert sum(v or 0 for v in snapshot.at_peak.values()) == snapshot.peak_bytes
    labels = {row.component.value: row.label for row in reconcile(hello, snapshot, None).rows}
    assert set(labels) == set(snapshot.at_peak)  # a CPU job: the model components only
    expected = {
        labels[key]: [fmt.fmt_bytes(held), fmt.fmt_bytes(snapshot.memory[key])]
        for key, held in snapshot.at_peak.items()
    }
    total = f"Peak {fmt.fmt_bytes(snapshot.peak_bytes)} in {snapshot.peak_phase} = sum of the rows ✓"

    rc_file = tmp_path / "rc"
    tmux = Tmux("e2e")
    try:
        tmux.start(monitor_command(scenario, runtime, rc_file))

        def shows_anatomy() -> bool:
            screen = tmux.capture()
            rows_ok = all(row_figures(screen, label) == values for label, values in expected.items())
            return rows_ok and total in screen

        shown = wait_for(shows_anatomy, 60)
        screen = tmux.capture()
        assert shown, f"expected {expected} on screen; got:\n{screen}"
        # the process table lists the training PID (simulated on GPU 0) and the GPU model
        assert str(proc.pid) in screen and "H100" in screen

        tmux.keys("?")
        assert wait_for(lambda: "anatomy-top keys" in tmux.capture(), 10), tmux.capture()
        tmux.keys("q")  # closes the help
        assert wait_for(lambda: "anatomy-top keys" not in tmux.capture(), 10), tmux.capture()
        assert tmux.alive()
        tmux.keys("q")  # quits
        assert wait_for(lambda: not tmux.alive(), 15), tmux.capture()
        assert wait_for(rc_file.exists, 5)
        assert rc_file.read_text().strip() == "0"
    finally:
        tmux.kill()


def test_monitor_marks_a_process_that_died_of_oom(tmp_path: Path) -> None:
    """The hook's OOM record of a dead process stays on screen, marked, with its last anatomy."""
    from tui.demo import build_scenario

    pytest.importorskip("torch")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, ANATOMY_TOP_DIR=str(runtime))
    env.pop("ANATOMY_TOP", None)
    job = subprocess.run(
        [sys.executable, "-m", "tui.demo_train", "--batch", "4", "--seq", "32", "--oom-at-step", "3"],
        cwd=REPO,
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert job.returncode != 0
    oom_file = protocol.oom_path(runtime, _pid_of_oom(runtime))
    hello, snapshot = protocol.read_oom_file(oom_file)
    assert snapshot.oom and "simulated by the anatomy-top demo" in snapshot.oom

    scenario = tmp_path / "scenario.json"
    build_scenario(None, [], n_gpus=1).to_json(scenario)
    weights = fmt.fmt_bytes(snapshot.memory["weights"])
    rc_file = tmp_path / "rc"
    tmux = Tmux("oom")
    try:
        tmux.start(monitor_command(scenario, runtime, rc_file))

        def marked() -> bool:
            screen = tmux.capture()
            return (
                "OOM" in screen
                and "CUDA out of memory" in screen  # the start of the exception text (it wraps)
                and str(hello.pid) in screen
                and on_one_line(screen, "Weights", weights)
            )

        assert wait_for(marked, 60), tmux.capture()
        tmux.keys("q")
        assert wait_for(lambda: not tmux.alive(), 15), tmux.capture()
        assert wait_for(rc_file.exists, 5) and rc_file.read_text().strip() == "0"
    finally:
        tmux.kill()


def _pid_of_oom(runtime: Path) -> int:
    (path,) = protocol.discover_oom(runtime)
    pid = protocol.pid_from_path(path)
    assert pid is not None
    return pid
