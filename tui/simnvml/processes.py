"""Real local processes for simulated GPUs to list: the demo and tests need PIDs that exist.

A sleeper is a bash process that blocks in a builtin ``read`` (no child process, no CPU), started
through a symlink named after the program, so that ``ps``/psutil show a training job:
name "python", command line "python train.py --rank 3".
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

_SCRIPT = """\
# anatomy-top simulated training process: sleeps until terminated.
while :; do read -r -t 86400 _ <> "$ANATOMY_TOP_SLEEPER_FIFO"; done
"""

_spawned: list[subprocess.Popen[bytes]] = []
_workdirs: list[str] = []


def default_names(n: int) -> list[str]:
    return [f"python train.py --rank {i}" for i in range(n)]


def spawn_sleepers(n: int, names: Sequence[str] | None = None) -> list[subprocess.Popen[bytes]]:
    """Start ``n`` idle processes whose command lines are ``names`` (default
    "python train.py --rank i").

    Each name is "PROGRAM SCRIPT [ARGS...]" with a SCRIPT that does not start with "-". They are
    stopped by :func:`stop_sleepers`, or at interpreter exit at the latest.
    """
    names = list(names) if names is not None else default_names(n)
    if len(names) < n:
        raise ValueError(f"{n} sleepers but only {len(names)} names")
    bash = shutil.which("bash")
    if bash is None:
        raise RuntimeError("spawning sleepers needs bash")
    workdir = tempfile.mkdtemp(prefix="anatomy-top-sleepers-")
    _workdirs.append(workdir)
    fifo = os.path.join(workdir, "never-written")
    os.mkfifo(fifo)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ANATOMY_TOP_SLEEPER_FIFO": fifo}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name in names[:n]:
            argv = shlex.split(name)
            if len(argv) < 2 or argv[1].startswith("-"):
                raise ValueError(f"sleeper name {name!r} must look like 'PROGRAM SCRIPT [ARGS...]'")
            program = Path(workdir, "bin", os.path.basename(argv[0]))
            program.parent.mkdir(exist_ok=True)
            if not program.exists():
                program.symlink_to(bash)
            script = Path(workdir, argv[1])
            if not script.exists():  # never rewrite: running sleepers read it lazily
                script.parent.mkdir(parents=True, exist_ok=True)
                script.write_text(_SCRIPT, encoding="utf-8")
            proc = subprocess.Popen(
                argv,
                executable=str(program),
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            procs.append(proc)
            _spawned.append(proc)
    except BaseException:
        stop_sleepers(procs)
        raise
    _wait_until_exec_done(procs)
    return procs


def _wait_until_exec_done(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 5.0) -> None:
    """Popen returns once exec has begun, but the kernel sets the new command line a moment later:
    reading it in between gives an empty one (seen on a loaded machine). Wait until every command
    line is there, so whoever lists the sleepers sees what ``ps`` will show."""
    import time

    deadline = time.monotonic() + timeout
    pending = list(procs)
    while pending and time.monotonic() < deadline:
        still = []
        for proc in pending:
            try:
                with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                    ready = bool(f.read(1))
            except OSError:  # no /proc (not Linux), or the process already exited: nothing to wait for
                ready = True
            if not ready and proc.poll() is None:
                still.append(proc)
        pending = still
        if pending:
            time.sleep(0.002)


def stop_sleepers(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """Terminate and reap the given sleepers (those already gone are skipped)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        with contextlib.suppress(ValueError):
            _spawned.remove(proc)


@contextlib.contextmanager
def sleepers(n: int, names: Sequence[str] | None = None) -> Iterator[list[int]]:
    """``with sleepers(8) as pids: ...`` — spawn, yield the PIDs, stop."""
    procs = spawn_sleepers(n, names)
    try:
        yield [p.pid for p in procs]
    finally:
        stop_sleepers(procs)


def exited_pid() -> int:
    """The PID of a process that has run and been reaped: it no longer exists (until the kernel
    hands the number out again, which takes a full cycle of the PID space)."""
    for _ in range(10):
        proc = subprocess.Popen(["true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        proc.wait()
        if not os.path.exists(f"/proc/{proc.pid}"):
            return proc.pid
    raise RuntimeError("could not obtain the PID of an exited process")


def _cleanup() -> None:
    stop_sleepers(list(_spawned))
    for workdir in _workdirs:
        shutil.rmtree(workdir, ignore_errors=True)


atexit.register(_cleanup)
