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
    """Every finished step's snapshot, in order, as the publisher's thread and the recorder would see it
    (the monitor's reader keeps only the latest of those that arrive between two polls; this sees each
    one): each row the tracker adds to its step feed, made into its snapshot as it is counted."""
    from anatomy.hook import tracker as tracker_module
    from anatomy.step_feed import StepFeed

    seen: list[protocol.Snapshot] = []
    slot = StepFeed.written  # the slot's own descriptor, under the property below

    class Watched(StepFeed):
        __slots__ = ()

        @property  # type: ignore[override]
        def written(self) -> int:
            return int(slot.__get__(self))

        @written.setter
        def written(self, value: int) -> None:
            try:
                before = slot.__get__(self)
            except AttributeError:  # (set for the first time)
                before = -1
            slot.__set__(self, value)
            snap = self.snapshot(value - 1)
            if snap is not None:
                if value == before and seen:  # the same step built again in its place
                    seen[-1] = snap
                else:
                    seen.append(snap)

    monkeypatch.setattr(tracker_module, "StepFeed", Watched)
    return seen


@pytest.fixture
def st() -> SimpleNamespace:
    """The helpers of stack_helpers.py (importlib import mode cannot import conftest from a test module)."""
    return SimpleNamespace(**{name: getattr(h, name) for name in h.__all__})
