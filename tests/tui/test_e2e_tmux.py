"""End to end in a real terminal: a real CPU training process publishes through the hook, anatomy-top runs
in tmux against simulated GPUs with that PID on GPU 0, and the screen shows exactly the bytes the hook
measured. Then `?` opens the help, and `q` quits with exit code 0."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tmux_session import Tmux, wait_for

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


def monitor_command(
    scenario: Path, runtime: Path, rc_file: Path, env: str = "TERM=xterm-256color", args: str = ""
) -> str:
    script = Path(sys.executable).parent / "anatomy-top"
    exe = str(script) if script.exists() else f"{sys.executable} -m tui.cli"
    return (
        # COLUMNS/LINES leak in from the tmux server's environment and would override the pane's size;
        # the locale is the test's unless ``env`` sets one
        f"cd {REPO} && env -u COLUMNS -u LINES -u NO_COLOR ANATOMY_TOP_SIMULATE={scenario} "
        f"ANATOMY_TOP_DIR={runtime} LANG=C.UTF-8 {env} {exe} {args}; echo $? > {rc_file}"
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
    tmux = Tmux("e2e", WIDTH, HEIGHT)
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
    tmux = Tmux("oom", WIDTH, HEIGHT)
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


# ------------------------------------------------------------------------- every size, any terminal
# nvidia-smi's default fields, as the GPU table labels them.
SMI_LABELS = (
    "Fan",
    "Temp",
    "Perf",
    "Pwr:Usage/Cap",
    "Memory-Usage",
    "GPU-Util",
    "Compute M.",
    "Bus-Id",
    "Persist-M",
    "Disp.A",
    "Uncorr. ECC",
    "MIG M.",
)
PROCESS_LABELS = ("PID", "USER", "GPU MEM", "CPU%", "HOST MEM", "TIME", "COMMAND")
# SGR parameters that set a colour: 30-37/90-97 foreground, 40-47/100-107 background, 38;…/48;… extended.
_SGR = re.compile(r"\x1b\[([0-9;]*)m")


def colour_codes(screen: str) -> list[str]:
    found = []
    for params in _SGR.findall(screen):
        codes = [int(p) for p in params.split(";") if p]
        i = 0
        while i < len(codes):
            code = codes[i]
            if code in (38, 48):
                found.append(params)
                break
            if 30 <= code <= 37 or 40 <= code <= 47 or 90 <= code <= 97 or 100 <= code <= 107:
                found.append(params)
                break
            i += 1
    return found


def _screen_with(tmux: Tmux, needles: list[str], timeout: float = 60) -> str:
    wait_for(lambda: all(n in tmux.capture() for n in needles), timeout)
    screen = tmux.capture()
    missing = [n for n in needles if n not in screen]
    assert not missing, f"{missing} not on the {tmux.width}x{tmux.height} screen:\n{screen}"
    return screen


def _line_with(screen: str, *parts: str) -> str:
    return next((ln for ln in screen.splitlines() if all(p in ln for p in parts)), "")


def test_every_field_is_on_screen_at_each_size(tmp_path: Path, training) -> None:
    """200x50 and 160x45: every nvidia-smi field of every GPU on two lines, the anatomy pane beside
    them; 120x40: the compact GPU table and a process table with every column and the command;
    80x24: the training job (sorted first) in view; 60x20: the help fits and scrolls to its end."""
    import getpass

    from tui.demo import build_scenario
    from tui.screens.help import GLOSSARY

    proc, runtime, log = training
    _, snapshot = hook_snapshot(runtime, proc.pid, log)
    scenario_path = tmp_path / "scenario.json"
    scenario = build_scenario(proc.pid, [], n_gpus=8)
    scenario.to_json(scenario_path)
    user = getpass.getuser()
    pid = str(proc.pid)
    weights = fmt.fmt_bytes(snapshot.at_peak["weights"]) if snapshot.at_peak else "Weights"
    bus_ids = [g.bus_id for g in scenario.gpus]

    for width, height in ((200, 50), (160, 45)):
        tmux = Tmux(f"w{width}", width, height)
        try:
            tmux.start(monitor_command(scenario_path, runtime, tmp_path / f"rc{width}"))
            screen = _screen_with(tmux, [*SMI_LABELS, *bus_ids, "Weights", weights, pid])
            for label in SMI_LABELS:  # the two header lines: every label beside the anatomy pane
                assert "│" in _line_with(screen, label), label
            for index, bus in enumerate(bus_ids):  # each GPU's first line: index, bus, ECC, MIG
                first = _line_with(screen, bus)
                assert first.split()[0] == str(index) and "Disabled" in first and "Off" in first
            assert "700W" in screen and "Default" in screen and "GiB" in screen and "%" in screen
            for label in PROCESS_LABELS:
                assert label in _line_with(screen, "PID", "COMMAND"), label
            row = _line_with(screen, pid, "◆")
            assert user in row and "demo_train" in row and "GiB" in row, row
        finally:
            tmux.kill()

    tmux = Tmux("w120", 120, 40)
    try:
        tmux.start(monitor_command(scenario_path, runtime, tmp_path / "rc120"))
        screen = _screen_with(tmux, ["GPU-Util", "Temp", "Pwr:Usage/Cap", pid, "1 publishing"])
        header = _line_with(screen, "PID", "COMMAND")
        assert all(label in header for label in PROCESS_LABELS), header
        row = _line_with(screen, pid, "◆")
        # the whole command: program, module and its arguments
        assert "python -m tui.demo_train --steps 3" in row and user in row, row
        tmux.keys("f")  # the full layout: every field on two lines
        screen = _screen_with(tmux, ["Bus-Id", "MIG M.", "Compute M.", bus_ids[0]], timeout=10)
    finally:
        tmux.kill()

    tmux = Tmux("w80", 80, 24)
    try:
        tmux.start(monitor_command(scenario_path, runtime, tmp_path / "rc80"))
        screen = _screen_with(tmux, ["Memory-Usage", "GPU-Util", pid, "1 publishing"])
        assert _line_with(screen, pid).lstrip().startswith("◆")
        tmux.keys("Tab")
        _screen_with(tmux, ["Weights", weights], timeout=15)
    finally:
        tmux.kill()

    tmux = Tmux("w60", 60, 20)
    try:
        tmux.start(monitor_command(scenario_path, runtime, tmp_path / "rc60"))
        _screen_with(tmux, [pid, " q  Quit "])
        tmux.keys("?")
        _screen_with(tmux, ["anatomy-top keys"], timeout=10)
        last_component = "Unattributed"
        assert last_component not in tmux.capture()  # the help is longer than the screen ...
        tmux.keys("End")  # ... and scrolls to its end
        screen = _screen_with(tmux, [last_component, "escape, ? or q closes"], timeout=10)
        assert GLOSSARY[0][0] not in screen  # scrolled past its start
        tmux.keys("q")
        assert wait_for(lambda: "anatomy-top keys" not in tmux.capture(), 10)
        tmux.keys("C-c")  # ctrl+c quits
        assert wait_for(lambda: (tmp_path / "rc60").exists(), 15), tmux.capture()
        assert (tmp_path / "rc60").read_text().strip() == "0"
    finally:
        tmux.kill()


@pytest.mark.parametrize(
    ("env", "args", "colour", "ascii_only"),
    [
        ("TERM=dumb", "", False, False),
        ("NO_COLOR=1 TERM=xterm-256color", "", False, False),
        ("TERM=xterm-256color", "--ascii", True, True),
        ("LANG=C TERM=xterm-256color", "", True, True),
    ],
    ids=["TERM=dumb", "NO_COLOR=1", "--ascii", "LANG=C"],
)
def test_terminals_without_colour_or_unicode(
    tmp_path: Path, env: str, args: str, colour: bool, ascii_only: bool
) -> None:
    """No colour escape at all under TERM=dumb and NO_COLOR (the bars read through their characters, the
    selection through reverse video); nothing but ASCII under --ascii or a C locale."""
    from tui.demo import build_scenario

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    scenario_path = tmp_path / "scenario.json"
    build_scenario(os.getpid(), [], n_gpus=8).to_json(scenario_path)  # this test's own process on GPU 0
    rc_file = tmp_path / "rc"
    tmux = Tmux("term", 120, 40)
    try:
        tmux.start(monitor_command(scenario_path, runtime, rc_file, env=env, args=args))
        _screen_with(tmux, ["Memory-Usage", str(os.getpid()), " q  Quit "])
        tmux.keys("?")
        _screen_with(tmux, ["anatomy-top keys"], timeout=10)
        help_screen = tmux.capture(escapes=True)
        tmux.keys("Escape")
        assert wait_for(lambda: "anatomy-top keys" not in tmux.capture(), 10)
        screen = tmux.capture(escapes=True)
        plain = tmux.capture()
        for shown in (screen, help_screen):
            codes = colour_codes(shown)
            assert bool(codes) is colour, codes[:5]
        if ascii_only:
            assert plain.isascii() and help_screen.isascii(), [c for c in plain if not c.isascii()][:10]
            assert "#" in plain and "+" in help_screen  # meters and the help's border, in ASCII
        else:
            assert "█" in plain  # the meters' blocks carry the figure without colour
        assert "\x1b[7m" in screen or ";7m" in screen or "[7;" in screen  # the selection: reverse video
        tmux.keys("q")
        assert wait_for(rc_file.exists, 15) and rc_file.read_text().strip() == "0"
    finally:
        tmux.kill()
