"""What the monitor needs of its two data sources (tests and the demo pass fakes): the machine (NVML and
the host) and the training processes' anatomy (the hooks' sockets)."""

from __future__ import annotations

from typing import Protocol

from tui.sources.anatomy_source import TrainingReading
from tui.sources.model import MachineSnapshot


class MachineSourceLike(Protocol):
    def snapshot(self) -> MachineSnapshot: ...
    def close(self) -> None: ...


class AnatomySourceLike(Protocol):
    def read(self) -> TrainingReading: ...
    def close(self) -> None: ...


__all__ = ["AnatomySourceLike", "MachineSourceLike"]
