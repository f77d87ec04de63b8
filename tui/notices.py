"""What the monitor tells the user about an action's outcome: a notification, also kept in the app's
``action_messages`` (newest last) for scripts and tests. Nothing here raises into the app."""

from __future__ import annotations

from typing import Any

from textual.app import App
from textual.notifications import SeverityLevel

from tui.sources.filters import ProcessFilter
from tui.sources.model import MachineSnapshot

KEPT_MESSAGES = 50


def tell(app: App[Any], message: str, severity: SeverityLevel = "information", timeout: float = 6.0) -> None:
    messages = getattr(app, "action_messages", None)
    if isinstance(messages, list):
        messages.append(message)
        del messages[:-KEPT_MESSAGES]
    app.notify(message, severity=severity, timeout=timeout)


def unknown_gpus_notice(process_filter: ProcessFilter, machine: MachineSnapshot | None) -> str | None:
    """What to say when --only names a GPU the machine does not have (a typo shows an empty table)."""
    if machine is None or not machine.nvml.available:
        return None
    unknown = process_filter.unknown_gpus(machine.gpus)
    if not unknown:
        return None
    have = ", ".join(str(g.index) for g in machine.gpus) or "none"
    names = ",".join(str(i) for i in unknown)
    return f"--only {names}: no such GPU here (GPUs: {have})"


__all__ = ["tell", "unknown_gpus_notice"]
