"""The bottom line: the keys the monitor answers to, from the app's own bindings (those marked ``show``).

Textual's ``Footer`` is a container of one widget per key that recomposes on every focus change; at
start-up it was the largest single cost of the first frame (~0.1 s of style updates on a 2-core box).
This is one line of text, painted once; a click on a key runs that key's action, as the Footer did.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.text import Text
from textual import events
from textual.binding import Binding

from tui.widgets.text_static import TextStatic

KEY_NAMES = {"question_mark": "?", "slash": "/", "plus": "+", "minus": "-"}


def key_label(key: str) -> str:
    """A key as the key bar and the help show it."""
    return KEY_NAMES.get(key, key)


def key_bar_text(bindings: Iterable[Binding]) -> tuple[Text, list[tuple[int, int, str]]]:
    """The line and, per shown key, its (start, end, action) columns (for clicks)."""
    text = Text(no_wrap=True, overflow="ellipsis")
    spans: list[tuple[int, int, str]] = []
    for binding in bindings:
        if not binding.show:
            continue
        start = text.cell_len
        text.append(f" {key_label(binding.key)} ", style="bold reverse")
        text.append(f" {binding.description} ")
        spans.append((start, text.cell_len, binding.action))
        text.append(" ")
    return text, spans


class KeyBar(TextStatic):
    def __init__(self, bindings: Iterable[Binding], **kwargs: object) -> None:
        text, self._spans = key_bar_text(bindings)
        super().__init__(text, **kwargs)

    def on_click(self, event: events.Click) -> None:
        for start, end, action in self._spans:
            if start <= event.x < end:
                event.stop()
                self.app.call_later(self.app.run_action, action)
                return
