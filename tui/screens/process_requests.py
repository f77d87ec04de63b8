"""What a screen asks the monitor to do to a process it shows (the tree's selection, not the table's):
posted as messages, so a screen needs no handle on the code that acts (``tui.selection``)."""

from __future__ import annotations

from textual.message import Message


class SignalRequested(Message):
    """Ask first, then send ``name`` ("terminate", "kill", "interrupt") to ``pid`` if it is still the
    process that started at ``started_at``."""

    def __init__(self, pid: int, started_at: float | None, name: str) -> None:
        super().__init__()
        self.pid = pid
        self.started_at = started_at
        self.name = name


class EnvironmentRequested(Message):
    """Show the environment of ``pid`` (``user`` and ``command`` title it)."""

    def __init__(self, pid: int, user: str | None, command: str | None) -> None:
        super().__init__()
        self.pid = pid
        self.user = user
        self.command = command


__all__ = ["EnvironmentRequested", "SignalRequested"]
