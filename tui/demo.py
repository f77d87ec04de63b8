"""``anatomy-top --demo``: a simulated 8-GPU box with real local processes on it, one of them a real
(small, CPU) training job publishing its anatomy through the hook.

``start_demo()`` spawns the training job (``python -m tui.demo_train``, its own process: the monitor never
imports torch) and a few sleeper processes with realistic command lines, writes a simulated-NVML scenario
mapping the training PID onto GPU 0 and the sleepers across the GPUs, and points this process at it
(``ANATOMY_TOP_SIMULATE``) and at a private runtime directory (``ANATOMY_TOP_DIR``).
``DemoHandle.stop()`` ends everything it started; it also runs at exit and on SIGTERM/SIGHUP.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import importlib.util
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

GIB = 1 << 30
MIB = 1 << 20

# (command line shown in the process table, GPU memory) of the processes sharing the demo box.
SLEEPERS: tuple[tuple[str, int], ...] = (
    ("python train.py --config configs/llama-7b-lora.yaml --rank 0", 61 * GIB + 412 * MIB),
    ("python train.py --config configs/llama-7b-lora.yaml --rank 1", 61 * GIB + 398 * MIB),
    ("torchrun --nproc-per-node 2 pretrain_gpt.py --micro-batch-size 4", 47 * GIB + 120 * MIB),
    ("python -m vllm.entrypoints.openai.api_server --model mistral-7b", 71 * GIB + 3 * MIB),
    ("python eval.py --ckpt runs/bert-large/step-12000 --split dev", 9 * GIB + 640 * MIB),
    ("jupyter-lab --no-browser --port 8890", 3 * GIB + 210 * MIB),
    ("python sweep.py --trial 17 --lr 3e-4 --batch-size 64", 22 * GIB + 771 * MIB),
    ("python -u finetune_whisper.py --fp16 --grad-accum 8", 35 * GIB + 58 * MIB),
)
TRAIN_GPU_MEMORY = 2 * GIB + 310 * MIB
# One thread and a pause between steps keep the demo's job near half a core; its model (~19 M parameters,
# ~0.4 s a step) makes weights, optimizer states and gradients dominate the memory bar.
TRAIN_ARGS: tuple[str, ...] = ("--pause", "0.5", "--threads", "1", "--sample-every", "10")
NO_TORCH_MESSAGE = (
    "anatomy-top demo: torch is not installed, so the demo's training job cannot run; the simulated GPUs "
    "are shown without anatomy (install the 'train' extra: pip install 'anatomy-top[train]')"
)


def _die_with_parent() -> None:
    # Linux: the child gets SIGTERM when the monitor dies, even by SIGKILL, so a demo never leaks jobs.
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _spawn(
    argv: Sequence[str], env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen:
    out: Any = subprocess.DEVNULL
    if log is not None:
        out = open(log, "ab")  # noqa: SIM115 - handed to the child, closed right after the spawn
    try:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out if log is not None else subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            start_new_session=True,  # keys pressed in the monitor's terminal never reach the children
        )
    finally:
        if log is not None:
            out.close()


def spawn_sleeper(command: str, bin_dir: Path) -> subprocess.Popen:
    """A process that idles while ``ps`` shows ``command`` as its command line and its first word as its
    name: bash (through a symlink named like that word) reading a script from a pipe we keep open; it
    blocks in the ``read`` builtin (no child process), and exits by itself when the pipe closes."""
    name = os.path.basename(shlex.split(command)[0]) or "python"
    link = bin_dir / name
    if not link.exists():
        link.symlink_to(shutil.which("bash") or "/bin/bash")
    proc = subprocess.Popen(
        [command],
        executable=str(link),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        start_new_session=True,
    )
    assert proc.stdin is not None
    proc.stdin.write(b"read -r _\n")
    proc.stdin.flush()
    return proc


def spawn_sleepers(commands: Sequence[str], bin_dir: Path) -> list[subprocess.Popen]:
    procs: list[subprocess.Popen] = []
    try:
        for command in commands:
            procs.append(spawn_sleeper(command, bin_dir))
    except BaseException:
        stop_processes(procs)
        raise
    return procs


def stop_processes(procs: Sequence[subprocess.Popen], timeout: float = 3.0) -> None:
    """Terminate, wait, kill what is left; close the pipes we hold."""
    for proc in procs:
        with contextlib.suppress(OSError):
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


@dataclass
class DemoHandle:
    directory: Path  # the demo's private temp dir: scenario, runtime dir, training log
    scenario_path: Path
    runtime_dir: Path
    train: subprocess.Popen | None
    sleepers: list[subprocess.Popen] = field(default_factory=list)
    saved_env: dict[str, str | None] = field(default_factory=dict)
    _stopped: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def train_pid(self) -> int | None:
        return self.train.pid if self.train is not None else None

    @property
    def train_log(self) -> Path:
        return self.directory / "train.log"

    def wait_until_publishing(self, timeout: float = 30.0, op_groups: bool = False) -> bool:
        """Block until the training job's first snapshot arrived — with ``op_groups``, its first measured
        step with op groups (``--demo --once``: the report then shows the whole anatomy) — False on
        timeout, when there is no training job, or when it died."""
        if self.train is None:
            return False
        from tui.sources.anatomy_source import AnatomySource

        deadline = time.monotonic() + timeout
        with AnatomySource(self.runtime_dir) as source:
            while time.monotonic() < deadline and self.train.poll() is None:
                procs = source.poll(wait_for_first_s=min(0.5, max(0.0, deadline - time.monotonic())))
                for p in procs:
                    snap = p.snapshot if p.pid == self.train.pid else None
                    if snap is not None and (snap.op_groups or not op_groups):
                        return True
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        """Kill everything the demo started, restore the environment, remove its files. Idempotent."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        stop_processes([p for p in [self.train, *self.sleepers] if p is not None])
        for key, value in self.saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> DemoHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def build_scenario(train_pid: int | None, sleeper_pids: Sequence[int], n_gpus: int = 8) -> Any:
    """The simulated box: the training job alone on GPU 0, the sleepers spread over the other GPUs."""
    from tui.simnvml.curves import Curve
    from tui.simnvml.scenario import Scenario

    pids = ([train_pid] if train_pid is not None else []) + list(sleeper_pids)
    scenario = Scenario.demo_box(n_gpus=n_gpus, pids=pids)
    placed = []
    for proc in scenario.processes:
        if proc.pid == train_pid:
            memory = Curve.constant(TRAIN_GPU_MEMORY)
            placed.append(dataclasses.replace(proc, gpu_index=0, used_memory=memory))
            continue
        i = list(sleeper_pids).index(proc.pid)
        gpu = 1 + i % (n_gpus - 1) if n_gpus > 1 else 0  # GPU 0 is the training job's own
        memory = Curve.constant(SLEEPERS[i % len(SLEEPERS)][1])
        placed.append(dataclasses.replace(proc, gpu_index=gpu, used_memory=memory))
    scenario.processes = placed
    scenario.validate()
    return scenario


def start_demo(
    n_gpus: int = 8,
    n_sleepers: int = len(SLEEPERS),
    train: bool = True,
    train_args: Sequence[str] = TRAIN_ARGS,
    install_signal_handlers: bool = True,
) -> DemoHandle:
    """Start the demo's processes and point this process's environment at the simulated box."""
    directory = Path(tempfile.mkdtemp(prefix="anatomy-top-demo-"))
    runtime = directory / "run"
    runtime.mkdir(mode=0o700)
    handle = DemoHandle(
        directory=directory, scenario_path=directory / "scenario.json", runtime_dir=runtime, train=None
    )
    atexit.register(handle.stop)
    try:
        if train and torch_available():
            env = dict(os.environ, ANATOMY_TOP_DIR=str(runtime))
            env.pop("ANATOMY_TOP_SIMULATE", None)
            env.pop("ANATOMY_TOP", None)
            handle.train = _spawn(
                [sys.executable, "-m", "tui.demo_train", *train_args], env=env, log=handle.train_log
            )
        elif train:
            print(NO_TORCH_MESSAGE, file=sys.stderr)
        bin_dir = directory / "bin"
        bin_dir.mkdir()
        commands = [SLEEPERS[i % len(SLEEPERS)][0] for i in range(n_sleepers)]
        handle.sleepers = spawn_sleepers(commands, bin_dir)
        scenario = build_scenario(handle.train_pid, [p.pid for p in handle.sleepers], n_gpus)
        scenario.to_json(handle.scenario_path)
    except BaseException:
        handle.stop()
        raise
    for key, value in (("ANATOMY_TOP_SIMULATE", handle.scenario_path), ("ANATOMY_TOP_DIR", runtime)):
        handle.saved_env[key] = os.environ.get(key)
        os.environ[key] = str(value)
    if install_signal_handlers and threading.current_thread() is threading.main_thread():
        _install_signal_handlers(handle)
    return handle


def _install_signal_handlers(handle: DemoHandle) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(sig)

        def on_signal(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
            handle.stop()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_IGN:
                return
            else:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, on_signal)
