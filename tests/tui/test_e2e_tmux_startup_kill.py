"""A monitor whose terminal goes away while it starts exits, in a real terminal.

Closing a tmux pane (the server killed: the pty hangs up, the kernel sends SIGHUP and SIGCONT) at many
moments of start-up — while the start-up frame is drawn, while Textual loads, as its key bar appears, once
it runs — must leave no process behind: each time the monitor is gone within a second. Textual's own
SIGCONT handler restarted application mode inside whatever the main thread was doing and left the
monitor hung for good (every time when the pane was closed as the key bar appeared).

Then SIGHUP alone, the pane kept (a shell goes on in it): the monitor exits with 129 and gives the
terminal back — alternate screen off, cursor shown, mouse reporting off — at each moment too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from tmux_session import Tmux, wait_for

from tui.simnvml import Scenario

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="the tmux binary is not installed"),
]

REPO = Path(__file__).resolve().parents[2]
KEY_BAR = "key bar"  # a moment: as soon as Textual's key bar is on screen
# From the start-up frame (~0.1 s) through Textual's import and start (~0.5-1.5 s) to a running monitor.
KILL_MOMENTS: list[float | str] = [0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 1.2, 1.5, 2.0, 2.5]
KILL_MOMENTS += [KEY_BAR] * 3
HUP_MOMENTS: list[float | str] = [0.1, 0.4, 0.8, KEY_BAR, 2.0]
# A monitor exits within a second (~0.3 s here: Textual's shutdown); a machine with more runnable
# processes than cores stretches that (2-3 s at a load of 15 on 2 cores), so the bound grows with the
# load. A hung monitor never exits: any bound tells the two apart.
GONE_WITHIN_S = 1.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def _command(tmp: Path, pid_file: Path, rc_file: Path, then: str) -> str:
    script = Path(sys.executable).parent / "anatomy-top"
    exe = str(script) if script.exists() else f"{sys.executable} -m tui.cli"
    scenario = tmp / "scenario.json"
    if not scenario.exists():
        Scenario.demo_box(4).to_json(scenario)
    runtime = tmp / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    # `exec` in a subshell: the monitor is the pane's process (the terminal's foreground process, as
    # when typed at a prompt), its PID written first; the outer shell records its exit status.
    return (
        f"cd {REPO} && (echo $BASHPID > {pid_file}; exec env -u COLUMNS -u LINES -u NO_COLOR "
        f"ANATOMY_TOP_SIMULATE={scenario} ANATOMY_TOP_DIR={runtime} PYTHONPATH={REPO} LANG=C.UTF-8 "
        f"TERM=xterm-256color {exe}); echo $? > {rc_file}; {then}"
    )


def _status(rc_file: Path) -> str:
    try:
        return rc_file.read_text().strip()
    except FileNotFoundError:
        return ""


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")  # exited, not yet reaped


def _start(tmux: Tmux, tmp: Path, moment: float | str, *, keep: bool) -> tuple[int, float]:
    """Start the monitor and wait for ``moment``; returns its PID and when it started."""
    pid_file, rc_file = tmp / "pid", tmp / "rc"
    for f in (pid_file, rc_file):
        f.unlink(missing_ok=True)
    # With ``keep``, the pane lives on after the monitor (as the shell it was typed in would), so the
    # terminal's modes read afterwards are what the monitor left behind.
    tmux.start(f"bash -c '{_command(tmp, pid_file, rc_file, 'exec sleep 60' if keep else 'true')}'")
    started = time.monotonic()
    assert wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "", 10, step=0.005)
    pid = int(pid_file.read_text())
    if moment == KEY_BAR:
        assert wait_for(lambda: "Quit" in tmux.capture(), 30, step=0.01), tmux.capture()
    else:
        assert isinstance(moment, float)
        time.sleep(max(0.0, moment - (time.monotonic() - started)))
    return pid, started


def _linger(pid: int) -> str:
    """What a lingering monitor waits in: each thread's kernel wait, and its Python stacks (gdb)."""
    try:
        threads = sorted(Path(f"/proc/{pid}/task").iterdir())
        waits = ", ".join(f"{t.name}: {(t / 'wchan').read_text()}" for t in threads)
    except OSError:
        return "gone"
    gdb = shutil.which("gdb")
    if gdb is None:
        return waits
    import subprocess

    args = [
        gdb,
        "-p",
        str(pid),
        "-batch",
        "-iex",
        "add-auto-load-safe-path /",
        "-ex",
        "thread apply all py-bt",
    ]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return waits
    return (
        waits + "\n" + "\n".join(ln for ln in out.splitlines() if ln.startswith(("Thread", "  File", "    ")))
    )


def test_closing_the_pane_at_any_moment_of_start_up_ends_the_monitor(tmp_path: Path) -> None:
    results: list[tuple[float | str, float, float | None]] = []
    lingering: list[int] = []
    try:
        for i, moment in enumerate(KILL_MOMENTS):
            tmux = Tmux(f"kill{i}", 120, 40)
            try:
                pid, started = _start(tmux, tmp_path, moment, keep=False)
                killed = time.monotonic()
            finally:
                tmux.kill()  # the pane, its pty and the server: SIGHUP + SIGCONT to the monitor
            gone = wait_for(lambda pid=pid: _gone(pid), GONE_WITHIN_S, step=0.01)
            results.append((moment, killed - started, time.monotonic() - killed if gone else None))
            if not gone:
                lingering.append(pid)
        assert not lingering, (
            f"monitors left running after their pane closed: {[(p, _linger(p)) for p in lingering]}; "
            f"every moment (moment, killed after s, gone after s): {results}"
        )
        assert len(results) == len(KILL_MOMENTS)
    finally:
        for pid in lingering:
            with_suppressed_kill(pid)


def test_sighup_at_any_moment_of_start_up_gives_the_terminal_back(tmp_path: Path) -> None:
    for i, moment in enumerate(HUP_MOMENTS):
        tmux = Tmux(f"hup{i}", 120, 40)
        pid = 0
        try:
            pid, _ = _start(tmux, tmp_path, moment, keep=True)
            os.kill(pid, signal.SIGHUP)
            assert wait_for(lambda pid=pid: _gone(pid), GONE_WITHIN_S, step=0.01), (moment, _linger(pid))
            # The shell's redirection creates the file, then writes the status: wait for the status.
            assert wait_for(lambda: _status(tmp_path / "rc") != "", 5), moment
            assert (tmp_path / "rc").read_text().strip() == str(128 + signal.SIGHUP), moment
            modes = tmux.display(
                "#{alternate_on} #{cursor_flag} #{mouse_standard_flag} #{mouse_any_flag} #{mouse_sgr_flag}"
            )
            assert modes == "0 1 0 0 0", f"at {moment}: alternate screen, cursor, mouse (3 modes) = {modes}"
        finally:
            tmux.kill()
            if pid and not _gone(pid):
                with_suppressed_kill(pid)


def with_suppressed_kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
