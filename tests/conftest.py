"""Fixtures for every test: the flight recorder never writes to the real home. And one to ask for: a
process that compiled nothing."""

from __future__ import annotations

import collections
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_state_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Each test records (the default: on) into its own $XDG_STATE_HOME, inherited by the processes it
    starts; ANATOMY_TOP_RECORD is unset unless a test sets it."""
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    monkeypatch.delenv("ANATOMY_TOP_RECORD", raising=False)
    yield state


@pytest.fixture
def nothing_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that compiled nothing: earlier tests of this process may have compiled, Dynamo's counters say
    so process-wide, and then no step rests."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        monkeypatch.setattr(dynamo.utils, "counters", collections.defaultdict(collections.Counter))
