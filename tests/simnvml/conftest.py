"""Fixtures for the simulated-NVML tests: a hand-driven clock and an installed simulation."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pynvml
import pytest

from tui.simnvml import Scenario, SimulatedNvml, install, uninstall


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def simulate(clock: FakeClock) -> Iterator[Callable[..., SimulatedNvml]]:
    """``simulate(scenario, init=True)`` installs the scenario (on the fake clock) and, unless told
    otherwise, calls nvmlInit; everything is undone after the test."""

    def start(scenario: Scenario, init: bool = True, **kwargs: object) -> SimulatedNvml:
        lib = install(scenario, clock=clock, **kwargs)  # type: ignore[arg-type]
        if init:
            pynvml.nvmlInit()
        return lib

    yield start
    uninstall()
