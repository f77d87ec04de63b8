"""Fixtures for every test: the flight recorder never writes to the real home."""

from __future__ import annotations

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
