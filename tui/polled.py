"""What the app's poll worker hands to the UI thread: one sample of both sources (``AnatomyTopApp.collect``),
cleaned for the screen."""

from __future__ import annotations

from textual.message import Message

from tui.sources.model import MachineSnapshot
from tui.view.poll import PollView


class Polled(Message):
    """One poll's results, posted from the worker thread: what each pane shows (``view``, with the last
    machine snapshot where this poll read none), and what the poll could not do (``errors``, cleaned)."""

    def __init__(
        self, view: PollView, machine: MachineSnapshot | None = None, errors: list[str] | None = None
    ) -> None:
        super().__init__()
        self.view = view
        self.machine = machine  # this poll's machine snapshot; None where NVML's side failed
        self.errors = errors or []

    def can_replace(self, message: Message) -> bool:
        # A newer sample makes a queued older one worthless.
        return isinstance(message, Polled)


__all__ = ["Polled"]
