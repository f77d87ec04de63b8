"""The help screen: every key the monitor answers to, from the same table the app binds."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

# (keys as shown, what they do). The app's BINDINGS implement exactly these; a test presses each one.
KEYS: tuple[tuple[str, str], ...] = (
    ("↑ ↓  j k", "move the selection (scroll the anatomy pane)"),
    ("PgUp PgDn Home End", "move a page, or to the first / last process"),
    ("tab", "switch pane: processes / anatomy"),
    ("s", "sort by the next column"),
    ("S", "reverse the sort order"),
    ("/", "filter processes by command, user or PID"),
    ("enter", "keep the filter and return to the list"),
    ("escape", "clear the filter; close this help"),
    ("p", "pause / resume refreshing"),
    ("+", "refresh less often (longer interval)"),
    ("-", "refresh more often (shorter interval)"),
    ("x", "dismiss the shown OOM record"),
    ("?", "show this help"),
    ("q", "quit"),
)


def help_table() -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for keys, what in KEYS:
        table.add_row(Text(keys), Text(what))
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 74; max-width: 100%; height: auto; max-height: 100%;
        border: round $accent; padding: 0 1; background: $surface;
    }
    HelpScreen > Vertical > Static { width: 1fr; }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text("anatomy-top keys", style="bold"))
            yield Static(help_table(), id="help-keys")
            yield Static(Text("escape, ? or q closes this help", style="bright_black"))

    def action_close(self) -> None:
        self.dismiss(None)
