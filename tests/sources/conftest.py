"""Fixtures for the data-layer tests: hand-built snapshots, real sleeper processes, the simulated NVML."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

HERE = Path(__file__).parent


def _load(name: str) -> ModuleType:
    # --import-mode=importlib puts no test directory on sys.path: load helper modules by path.
    spec = importlib.util.spec_from_file_location(f"tests_sources_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def shots() -> ModuleType:
    return _load("snapshots")


@pytest.fixture(scope="session")
def expect() -> ModuleType:
    return _load("expect")


def _wait_until_asleep(pid: int) -> None:
    """Until the process runs ``sleep`` (bash has exec'd it) and sleeps: before that its name, command
    line and RSS change under the reader, and two readings a moment apart could not agree."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            exe, state = "", b""
        if exe.endswith("sleep") and state == b"S":
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not settle into sleep")


@pytest.fixture
def wait_until_asleep() -> Callable[[int], None]:
    return _wait_until_asleep


@pytest.fixture
def spawn() -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Start a real local process whose argv[0] is the given text (so its command line looks real)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(argv0: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            ["bash", "-c", 'exec -a "$0" sleep 300', argv0],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def exited_pid() -> int:
    """The PID of a process that has certainly exited (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


class FakeClock:
    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self.on_read: Callable[[], None] | None = None  # a hook run on every reading (to block a call)

    def __call__(self) -> float:
        if self.on_read is not None:
            self.on_read()
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sim(clock: FakeClock) -> Iterator[Callable[..., Any]]:
    """Install a simulated NVML (the real pynvml path) for one test; uninstalled afterwards."""
    import tui.simnvml as simnvml

    installed = False

    def install(scenario: Any) -> Any:
        nonlocal installed
        installed = True
        return simnvml.install(scenario, clock=clock)

    yield install
    if installed:
        simnvml.uninstall()
