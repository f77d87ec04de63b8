"""Signals to real child processes: one that ignores SIGTERM, one owned by another user (as root, and
from a non-root monitor), one that exits before the confirmation, a PID whose process changed."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tui.sources import signals
from tui.sources.signals import Gone, identify, refusal, send, still_running

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not IS_ROOT or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def cmdline_of(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture
def start() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start a real process; waits until it runs ``sleep`` (exec done, signal dispositions final)."""
    started: list[subprocess.Popen[bytes]] = []

    def run(argv: list[str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # SIGINT as a terminal's process has it: a test run started in the background by a shell without
            # job control (`cmd &`, nohup) ignores SIGINT, and a child inherits that
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        started.append(proc)
        assert wait_for(lambda: cmdline_of(proc.pid).startswith(b"sleep")), cmdline_of(proc.pid)
        return proc

    yield run
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_sigterm_is_sent_to_a_process_that_ignores_it_and_sigkill_ends_it(
    start: Callable[..., subprocess.Popen[bytes]],
) -> None:
    # An ignored signal stays ignored across exec: this sleep ignores SIGTERM.
    proc = start(["bash", "-c", "trap '' TERM; exec sleep 300"])
    target = identify(proc.pid)
    assert target.name == "sleep" and target.command == "sleep 300"
    outcome = send(target, signal.SIGTERM)
    assert outcome.sent and outcome.message == f"sent SIGTERM to PID {proc.pid} (sleep)"
    time.sleep(0.3)
    assert proc.poll() is None and still_running(target)  # it ignored it
    outcome = send(target, signal.SIGKILL)
    assert outcome.sent
    assert proc.wait(timeout=10) == -signal.SIGKILL
    assert not still_running(target)


def test_sigint_reaches_the_process(start: Callable[..., subprocess.Popen[bytes]]) -> None:
    proc = start(["sleep", "300"])
    assert send(identify(proc.pid), signal.SIGINT).sent
    assert proc.wait(timeout=10) == -signal.SIGINT


def test_a_process_that_exits_before_the_confirmation_is_not_signalled(
    start: Callable[..., subprocess.Popen[bytes]],
) -> None:
    proc = start(["sleep", "300"])
    target = identify(proc.pid)  # what the confirmation shows
    os.kill(proc.pid, signal.SIGKILL)  # it dies while the dialog is up, and stays a zombie
    assert wait_for(lambda: not still_running(target))
    outcome = send(target, signal.SIGTERM)
    assert not outcome.sent and "has exited" in outcome.message
    proc.wait()  # reaped: the PID names nothing now
    outcome = send(target, signal.SIGTERM)
    assert not outcome.sent and outcome.message == f"not sent: PID {proc.pid} has exited"
    with pytest.raises(Gone, match="has exited"):
        identify(proc.pid)


def test_a_reused_pid_is_never_signalled(start: Callable[..., subprocess.Popen[bytes]]) -> None:
    """The confirmed process's start time differs from the PID's owner now: as if it had exited and
    its number had gone to this new process."""
    proc = start(["sleep", "300"])
    now = identify(proc.pid)
    confirmed = dataclasses.replace(now, start_ticks=now.start_ticks - 100)
    outcome = send(confirmed, signal.SIGKILL)
    assert not outcome.sent and "has exited" in outcome.message
    time.sleep(0.2)
    assert proc.poll() is None  # the process now holding the number is untouched
    assert now.started_at is not None
    with pytest.raises(Gone, match="now belongs to another process"):
        identify(proc.pid, expected_start=now.started_at - 3.0)
    assert identify(proc.pid, expected_start=now.started_at) == now


def test_kill_is_used_where_there_are_no_pidfds(
    start: Callable[..., subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "pidfd_open")
    proc = start(["sleep", "300"])
    target = identify(proc.pid)
    stale = dataclasses.replace(target, start_ticks=target.start_ticks + 1)
    assert not send(stale, signal.SIGTERM).sent  # the start-time check still holds
    assert send(target, signal.SIGTERM).sent
    assert proc.wait(timeout=10) == -signal.SIGTERM


def test_the_monitor_never_signals_itself() -> None:
    reason = refusal(identify(os.getpid()))
    assert reason is not None and "this monitor itself" in reason


def test_policy_own_processes_unless_root(start: Callable[..., subprocess.Popen[bytes]]) -> None:
    proc = start(["sleep", "300"])
    target = identify(proc.pid)
    mine = os.getuid()
    assert refusal(target, euid=0, uid=0) is None
    assert refusal(target, euid=mine, uid=mine) is None
    other = dataclasses.replace(target, uid=4321, user="alice")
    reason = refusal(other, euid=1000, uid=1000)
    assert reason is not None and "belongs to alice" in reason and "only root" in reason
    assert refusal(other, euid=0, uid=1000) is None
    unknown = dataclasses.replace(target, uid=None, user=None)
    assert "cannot be read" in (refusal(unknown, euid=1000, uid=1000) or "")


@needs_root
def test_root_signals_another_users_process(start: Callable[..., subprocess.Popen[bytes]]) -> None:
    proc = start(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "300"])
    target = identify(proc.pid)
    assert (target.uid, target.user) == (NOBODY, "nobody")
    assert refusal(target) is None  # root may
    assert send(target, signal.SIGTERM).sent
    assert proc.wait(timeout=10) == -signal.SIGTERM


@needs_root
def test_a_non_root_monitor_is_refused_another_users_process(
    start: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """The monitor runs as nobody; the process belongs to root: the policy refuses before asking, and
    the kernel refuses too if asked anyway."""
    proc = start(["sleep", "300"])
    code = (
        "import signal, sys\n"
        "from tui.sources.signals import identify, refusal, send\n"
        f"t = identify({proc.pid})\n"
        "print(t.user)\n"
        "print(refusal(t))\n"
        "print(send(t, signal.SIGKILL).message)\n"
    )
    out = subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    user, reason, message = out.stdout.splitlines()
    assert user == "root"
    assert (
        reason
        == f"PID {proc.pid} belongs to root, not to you (nobody); only root may signal another user's process"
    )
    assert message == f"not permitted: the kernel refused SIGKILL to PID {proc.pid} (sleep) (EPERM)"
    time.sleep(0.2)
    assert proc.poll() is None


def test_signal_names() -> None:
    assert signals.SIGNALS == {
        "interrupt": signal.SIGINT,
        "terminate": signal.SIGTERM,
        "kill": signal.SIGKILL,
    }
    assert signals.signal_name(signal.SIGTERM) == "SIGTERM"
    with pytest.raises(Gone, match="not a process"):
        identify(0)
