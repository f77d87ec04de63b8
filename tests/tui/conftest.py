"""Fixtures for the app's headless tests: frozen data (tests/tui/frozen.py), fake sources, a fixed time
zone, and helpers that read what the screen shows."""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import frozen
from screen_reader import screen_text

from tui.app import AnatomyTopApp


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run ``async def`` tests in a fresh event loop (no asyncio plugin needed for Pilot tests)."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = inspect.signature(pyfuncitem.obj).parameters  # funcargs also holds the fixtures' fixtures
    asyncio.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True


@pytest.fixture
def utc() -> Iterator[None]:
    """The header shows local time: pin the zone so screens are reproducible."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if old is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old
    time.tzset()


@pytest.fixture
def make_app(utc: None) -> Callable[..., AnatomyTopApp]:
    def factory(
        machine: Any = None,
        training: Any = None,
        interval: float = 60.0,
        **kwargs: Any,
    ) -> AnatomyTopApp:
        machine_source = machine if machine is not None else frozen.FakeMachineSource()
        if not hasattr(machine_source, "snapshot"):
            machine_source = frozen.FakeMachineSource(machine_source)
        anatomy_source = training if training is not None else frozen.FakeAnatomySource()
        if isinstance(anatomy_source, list):
            anatomy_source = frozen.FakeAnatomySource(anatomy_source)
        kwargs.setdefault("handle_signals", False)
        kwargs.setdefault("host_lookup", frozen.frozen_host_lookup)
        return AnatomyTopApp(machine_source, anatomy_source, interval=interval, **kwargs)

    return factory


@pytest.fixture
def read_screen() -> Callable[[AnatomyTopApp], str]:
    return screen_text
