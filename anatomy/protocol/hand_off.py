"""What a publisher is handed besides snapshots: the recorder it feeds from its thread, and the source it
takes the newest snapshot from. Protocols only (the wire knows nothing of what records or what feeds).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from anatomy.protocol.messages import Hello, Snapshot


class StepRecorder(Protocol):
    """Where the publisher hands every finished step, from its own thread (the flight recorder,
    :class:`anatomy.recorder.Recorder`): passed in, so that the wire knows nothing of what records."""

    def tick(self, hello: Hello, snapshots: Iterable[Snapshot]) -> None: ...

    def close(self, hello: Hello, snapshots: Iterable[Snapshot]) -> None: ...


class LatestSource(Protocol):
    """Where a following publisher takes the newest snapshot (the hook's step feed,
    :class:`anatomy.step_feed.StepFeed`): ``written`` changes with every finished step; ``latest()``
    makes its snapshot, on the caller's thread."""

    written: int

    def latest(self) -> Snapshot | None: ...
