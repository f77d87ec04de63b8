"""A Static that repaints only when its text changed, and re-lays out the screen only when its height
may have changed: ``Static.update`` re-lays out the whole screen by default, which at one refresh a
second is most of an idle monitor's CPU."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tui.widgets.line_table import same_text


class TextStatic(Static):
    def __init__(self, text: Text | str = "", **kwargs: object) -> None:
        super().__init__(text, **kwargs)  # type: ignore[arg-type]
        self._text: Text | str | None = text

    @property
    def text(self) -> Text | str | None:
        return self._text

    def show_text(self, text: Text | str) -> None:
        if same_text(text, self._text):
            return
        layout = self._height_may_change(self._text, text)
        self._text = text
        self.update(text, layout=layout)

    def _height_may_change(self, before: Text | str | None, after: Text | str) -> bool:
        if before is None or not self.is_mounted:
            return True
        old = before.plain if isinstance(before, Text) else before
        new = after.plain if isinstance(after, Text) else after
        old_lines, new_lines = old.split("\n"), new.split("\n")
        if len(old_lines) != len(new_lines):
            return True
        width = self.content_size.width
        longest = max(Text(line).cell_len for line in (*old_lines, *new_lines))
        # Lines that fit never wrap: the height stays one row per line.
        return width <= 0 or longest >= width
