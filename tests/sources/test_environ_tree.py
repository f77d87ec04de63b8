"""The environment view's reader (readable, another user's, exited) and the process tree (parents up to
the root, children, processes NVML lists that /proc does not), on real processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tui.sources.environ import parse_environ, read_environ
from tui.sources.model import GpuProcess
from tui.sources.tree import ANCESTOR, CHILD, GPU, ProcessTree

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.fixture
def popen() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def run(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, **kwargs)  # type: ignore[call-overload]
        started.append(proc)
        return proc

    yield run
    for proc in started:
        if proc.poll() is None:
            if os.getpgid(proc.pid) == proc.pid:  # its own session: its children go with it
                os.killpg(proc.pid, 9)
            else:
                proc.kill()
        proc.wait()


# -- environment ---------------------------------------------------------------------------------


def test_a_readable_environment_in_the_process_order(popen: Callable[..., subprocess.Popen[bytes]]) -> None:
    env = {"PATH": os.environ["PATH"], "ANATOMY_A": "x=y=z", "ANATOMY_B": "", "ANATOMY_C": "naïve ☃"}
    proc = popen(["sleep", "300"], env=env)
    wait_for(lambda: comm(proc.pid) == "sleep")
    environment = read_environ(proc.pid)
    assert environment.reason is None
    assert environment.variables == tuple(env.items())


def test_an_exited_process_has_no_environment(exited_pid: int) -> None:
    environment = read_environ(exited_pid)
    assert environment.variables is None and environment.reason == f"PID {exited_pid} has exited"


def test_entries_are_kept_whatever_their_bytes() -> None:
    assert parse_environ(b"A=1\0BROKEN\0C=\xff\xfe\0\0") == (("A", "1"), ("BROKEN", ""), ("C", "\\xff\\xfe"))


@needs_root
def test_another_users_environment_is_not_readable_and_says_why(
    popen: Callable[..., subprocess.Popen[bytes]],
) -> None:
    proc = popen(["sleep", "300"], env={"SECRET_TOKEN": "hunter2"})  # root's
    wait_for(lambda: comm(proc.pid) == "sleep")
    code = (
        "from tui.sources.environ import read_environ\n"
        f"e = read_environ({proc.pid})\n"
        "print(e.variables)\n"
        "print(e.reason)\n"
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
    variables, reason = out.stdout.splitlines()
    assert variables == "None"
    assert reason == (
        f"PID {proc.pid}'s environment is not readable: it belongs to root, not to you (nobody); "
        "only its owner and root can read it"
    )
    assert "hunter2" not in out.stdout + out.stderr
    # Root reads anyone's, nobody's included.
    theirs = popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "300"],
        env={"THEIRS": "1"},
    )
    wait_for(lambda: comm(theirs.pid) == "sleep")
    assert read_environ(theirs.pid).variables == (("THEIRS", "1"),)


# -- tree ----------------------------------------------------------------------------------------


def test_the_tree_has_the_parent_chain_and_the_children(
    popen: Callable[..., subprocess.Popen[bytes]], exited_pid: int
) -> None:
    # launcher (bash) -> rank (bash, "on the GPU") -> worker (sleep)
    launcher = popen(["bash", "-c", "bash -c 'sleep 301 & wait' & wait"], start_new_session=True)
    wait_for(
        lambda: len(children_of(launcher.pid)) == 1 and len(children_of(children_of(launcher.pid)[0])) == 1
    )
    (rank,) = children_of(launcher.pid)
    (worker,) = children_of(rank)
    wait_for(lambda: comm(worker) == "sleep")
    gpu = [
        GpuProcess(gpu_index=1, pid=rank, type="C", gpu_memory=3 << 30),
        GpuProcess(gpu_index=3, pid=rank, type="C", gpu_memory=1 << 30),
        GpuProcess(gpu_index=0, pid=exited_pid, type="C", gpu_memory=1 << 20, command="ghost.py"),
    ]
    rows = ProcessTree().build(gpu)
    by_pid = {r.pid: r for r in rows}
    order = [r.pid for r in rows]
    # The chain from this test process down to the worker, each one level below its parent.
    chain = [os.getpid(), launcher.pid, rank, worker]
    positions = [order.index(pid) for pid in chain]
    assert positions == sorted(positions)
    depths = [by_pid[pid].depth for pid in chain]
    assert depths == list(range(depths[0], depths[0] + 4))
    assert [by_pid[pid].role for pid in chain] == [ANCESTOR, ANCESTOR, GPU, CHILD]
    assert by_pid[rank].gpus == (1, 3) and by_pid[rank].gpu_memory == 4 << 30
    assert by_pid[worker].command == "sleep 301" and by_pid[worker].gpus == ()
    assert by_pid[launcher.pid].ppid == os.getpid()
    # Every ancestor of this process up to the root is there; the root has depth 0.
    pid, ancestors = os.getpid(), []
    while pid > 0 and Path(f"/proc/{pid}").exists():
        ancestors.append(pid)
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    assert all(a in by_pid for a in ancestors) and by_pid[ancestors[-1]].depth == 0
    # A PID NVML lists but /proc does not: a root of its own, with what NVML's row knew.
    ghost = by_pid[exited_pid]
    assert (ghost.alive, ghost.depth, ghost.role, ghost.command) == (False, 0, GPU, "ghost.py")
    # The last-child flags: a row is its parent's last child when no sibling follows it.
    for i, r in enumerate(rows):
        assert len(r.last) == r.depth + 1
        following = next((q for q in rows[i + 1 :] if q.depth <= r.depth), None)
        assert r.last[-1] == (following is None or following.depth < r.depth), r
        if r.depth:
            parent = next(q for q in reversed(rows[:i]) if q.depth == r.depth - 1)
            assert r.last[:-1] == parent.last


def test_cpu_percent_from_the_second_pass(popen: Callable[..., subprocess.Popen[bytes]]) -> None:
    spinner = popen([sys.executable, "-c", "while True: pass"])
    wait_for(lambda: comm(spinner.pid).startswith("python"))
    tree = ProcessTree()
    gpu = [GpuProcess(gpu_index=0, pid=spinner.pid, type="C")]
    first = {r.pid: r for r in tree.build(gpu)}
    assert first[spinner.pid].cpu_percent is None  # one sample: no interval yet
    time.sleep(0.5)
    second = {r.pid: r for r in tree.build(gpu)}
    cpu = second[spinner.pid].cpu_percent
    assert cpu is not None and 20.0 < cpu <= 105.0  # a busy loop on a shared box
    assert second[spinner.pid].host_rss and second[spinner.pid].started_at
