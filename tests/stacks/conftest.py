"""Shared pieces of the stack tests: a private runtime directory per test, every snapshot the hook publishes,
and the helpers of stack_helpers.py (tiny models, padded batches, a monitor-side reader, the training
process's own counts) as the ``st`` fixture."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from anatomy import protocol

sys.path.insert(0, str(Path(__file__).parent))

import stack_helpers as h


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own ANATOMY_TOP_DIR; ANATOMY_TOP is unset unless a test sets it."""
    directory = tmp_path / "rt"
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(directory))
    monkeypatch.delenv("ANATOMY_TOP", raising=False)
    yield directory


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[protocol.Snapshot]:
    """Every snapshot the hook hands its publisher, in order (the monitor's reader keeps only the
    latest of those that arrive between two polls; this sees each one)."""
    from anatomy.hook.publishing import Channel

    seen: list[protocol.Snapshot] = []
    original = Channel.publish

    def publish(self: Channel, snap: protocol.Snapshot, hello: protocol.Hello) -> None:
        seen.append(snap)
        original(self, snap, hello)

    monkeypatch.setattr(Channel, "publish", publish)
    return seen


@pytest.fixture
def st() -> SimpleNamespace:
    """The helpers of stack_helpers.py (importlib import mode cannot import conftest from a test module)."""
    return SimpleNamespace(**{name: getattr(h, name) for name in h.__all__})
