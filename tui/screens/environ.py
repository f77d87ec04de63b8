"""The environment view: the selected process's environment variables (as it was started), or why they
cannot be shown. Names and values come from another process: every one goes through ``clean``."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.sanitize import clean
from tui.sources.environ import Environment


def environ_title(env: Environment, user: str | None, command: str | None) -> Text:
    text = Text(f"Environment of PID {env.pid}", style="bold")
    if user:
        text.append(f"  {clean(user)}", style="cyan")
    if command:
        text.append(f"  {clean(command)}", style="bright_black")
    return text


def environ_table(env: Environment) -> Table | Text:
    if env.variables is None:
        return Text(env.reason or "not available", style="yellow")
    if not env.variables:
        return Text("(empty)", style="bright_black")
    table = Table(box=None, show_header=False, padding=(0, 1, 0, 0), expand=True)
    table.add_column(style="bold cyan", no_wrap=True, max_width=40, overflow="fold")
    table.add_column(ratio=1, overflow="fold")
    for name, value in env.variables:
        table.add_row(Text(clean(name)), Text(clean(value)))
    return table


class EnvironScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,e", "close", "Close", show=False, id="environ.close", tooltip="close"),
    ]
    CSS_PATH = "screens.tcss"

    def __init__(self, env: Environment, user: str | None = None, command: str | None = None) -> None:
        super().__init__()
        self.env = env
        self.user = user
        self.command = command

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="environ-body"):
            yield Static(environ_title(self.env, self.user, self.command), id="environ-title")
            count = "" if self.env.variables is None else f"{len(self.env.variables)} variables, "
            yield Static(
                Text(
                    f"{count}as the process was started (later changes inside it do not show) · "
                    "↑ ↓ PgUp PgDn scroll · escape closes",
                    style="bright_black",
                ),
                id="environ-note",
            )
            yield Static(environ_table(self.env), id="environ-vars")

    def on_mount(self) -> None:
        self.query_one("#environ-body").focus()

    def action_close(self) -> None:
        self.dismiss(None)


__all__ = ["EnvironScreen", "environ_table", "environ_title"]
