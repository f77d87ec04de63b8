"""The confirmation before a signal: which process (PID, user, command, age), which signal, what it does.

Answers the signal's name (``"terminate"``, ``"kill"``, ``"interrupt"``) or None. T, K and I pick the
signal inside the dialog as well, so K then enter is a kill and K, T, enter a terminate.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from tui import format as fmt
from tui.sanitize import clean
from tui.sources.signals import SIGNALS, Target

COMMAND_MAX = 400  # characters of the command line shown: a huge one must not push the choices off screen
# (name, key, what it does to a training job)
CHOICES: tuple[tuple[str, str, str], ...] = (
    ("terminate", "T", "asks it to exit; it may clean up first (or ignore it)"),
    ("kill", "K", "ends it at once; it cannot catch it or save anything"),
    ("interrupt", "I", "as Ctrl-C in its terminal: a training loop stops at the next step"),
)


def describe_target(target: Target, now: float | None = None) -> Table:
    now = time.time() if now is None else now
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    table.add_row("PID", Text(str(target.pid)))
    table.add_row("User", Text(clean(target.user or (str(target.uid) if target.uid is not None else fmt.NA))))
    command = clean(target.command)
    if len(command) > COMMAND_MAX:
        command = f"{command[:COMMAND_MAX]}… ({len(command) - COMMAND_MAX} more characters)"
    table.add_row("Command", Text(command))
    age = None if target.started_at is None else max(0.0, now - target.started_at)
    table.add_row("Running", Text(fmt.fmt_elapsed(age)))
    return table


def choices_text(selected: str) -> Text:
    text = Text()
    for i, (name, key, what) in enumerate(CHOICES):
        if i:
            text.append("\n")
        chosen = name == selected
        text.append("▶ " if chosen else "  ", style="bold red")
        text.append(f" {key} ", style="bold reverse")
        text.append(f" {SIGNALS[name].name:<8}", style="bold red" if chosen else "bold")
        text.append(f" {what}", style="" if chosen else "bright_black")
    return text


class SignalDialog(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("T,t", "choose('terminate')", "SIGTERM", show=False, id="dialog.term", tooltip="SIGTERM"),
        Binding("K,k", "choose('kill')", "SIGKILL", show=False, id="dialog.kill", tooltip="SIGKILL"),
        Binding("I,i", "choose('interrupt')", "SIGINT", show=False, id="dialog.int", tooltip="SIGINT"),
        Binding("up", "step(-1)", "Previous", show=False, id="dialog.previous", tooltip="the signal above"),
        Binding("down", "step(1)", "Next", show=False, id="dialog.next", tooltip="the signal below"),
        Binding("enter,y", "send", "Send", show=False, id="dialog.send", tooltip="send the chosen signal"),
        Binding("escape,n,c,q", "cancel", "Cancel", show=False, id="dialog.cancel", tooltip="send nothing"),
    ]
    CSS_PATH = "screens.tcss"

    def __init__(self, target: Target, signal_name: str) -> None:
        super().__init__()
        if signal_name not in SIGNALS:
            raise ValueError(f"unknown signal {signal_name!r}")
        self.target = target
        self.selected = signal_name

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text(f"Send a signal to PID {self.target.pid}?"), id="signal-title")
            yield Static(describe_target(self.target), id="signal-target")
            yield Static(choices_text(self.selected), id="signal-choices")
            yield Static(
                Text("enter or y sends · T K I or ↑ ↓ choose · escape or n cancels", style="bright_black"),
                id="signal-help",
            )

    def action_choose(self, name: str) -> None:
        self.selected = name
        self.query_one("#signal-choices", Static).update(choices_text(name))

    def action_step(self, delta: int) -> None:
        names = [name for name, _, _ in CHOICES]
        self.action_choose(names[(names.index(self.selected) + delta) % len(names)])

    def action_send(self) -> None:
        self.dismiss(self.selected)

    def action_cancel(self) -> None:
        self.dismiss(None)


__all__ = ["CHOICES", "SignalDialog", "choices_text", "describe_target"]
