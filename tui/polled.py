"""What the app's poll worker hands to the UI thread: one sample of both sources (``AnatomyTopApp.collect``),
cleaned for the screen."""

from __future__ import annotations

from textual.message import Message

from tui.sources.anatomy_source import TrainingProcess
from tui.sources.model import GpuProcess, MachineSnapshot


class Polled(Message):
    """One poll's results, posted from the worker thread."""

    def __init__(
        self,
        machine: MachineSnapshot | None,
        training: list[TrainingProcess],
        host_figures: dict[int, GpuProcess] | None = None,
        errors: list[str] | None = None,
    ) -> None:
        super().__init__()
        self.machine = machine
        self.training = training
        self.host_figures = host_figures or {}
        self.errors = errors or []

    def can_replace(self, message: Message) -> bool:
        # A newer sample makes a queued older one worthless.
        return isinstance(message, Polled)


__all__ = ["Polled"]
