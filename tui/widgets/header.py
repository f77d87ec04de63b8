"""The top lines: driver and CUDA versions, host CPU and memory, refresh state, and the NVML banner
(their text: tui.widgets.header_text)."""

from __future__ import annotations

from typing import Any

from rich.segment import Segment
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from tui.sources.model import MachineSnapshot
from tui.view.header import HeaderView
from tui.widgets.header_text import COMPACT_BELOW, banner_text, header_text
from tui.widgets.line_table import same_text
from tui.widgets.text_static import TextStatic

__all__ = ["COMPACT_BELOW", "MachineHeader", "NvmlBanner", "TextLines", "banner_text", "header_text"]


class TextLines(Widget):
    """Rich text drawn through the line API, one strip per line, never wrapped (too long a line is
    cropped). A new text repaints only its changed lines, and re-lays out only when the number of lines
    changed: the header changes on every refresh (clock, CPU %), and a ``Static`` re-renders all of it
    through Textual's content pipeline, which was a fifth of a refresh's main-thread time."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._text = Text()
        self._lines: list[Text] = [Text()]
        self._strips: dict[int, Strip] = {}

    @property
    def text(self) -> Text:
        return self._text

    def show_text(self, text: Text) -> None:
        if same_text(text, self._text):
            return
        lines = list(text.split("\n", allow_blank=True)) or [Text()]
        old = self._lines
        self._text, self._lines = text, lines
        if len(lines) != len(old):
            self._strips.clear()
            self.refresh(layout=True)
            # Seen in tests: a layout asked for while the app lays out for another reason (the first
            # poll's text arriving as the screen settles) can be lost, leaving a two-line header one
            # line high until its line count next changes. Look once more after the next frame.
            self.call_after_refresh(self._check_height)
            return
        for y, (before, after) in enumerate(zip(old, lines, strict=True)):
            if not same_text(before, after):
                self._strips.pop(y, None)
                self.refresh(Region(0, y, self.size.width, 1))

    def _check_height(self) -> None:
        if self.is_mounted and self.display and self.size.height < len(self._lines):
            self.refresh(layout=True)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y >= len(self._lines):
            return Strip.blank(width, base)
        strip = self._strips.get(y)
        if strip is None:
            segments = list(self._lines[y].render(self.app.console, end=""))
            strip = Strip(Segment.apply_style(segments, base))
            self._strips[y] = strip
        return strip.crop_extend(0, width, base)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    def on_resize(self) -> None:
        self._strips.clear()


class MachineHeader(TextLines):
    _args: tuple[HeaderView | None, float, bool] = (None, 1.0, False)

    def show(self, header: HeaderView | None, interval: float, paused: bool) -> None:
        self._args = (header, interval, paused)
        width = self.size.width or self.app.size.width
        self.show_text(header_text(header, interval, paused, compact=width < COMPACT_BELOW))

    def on_resize(self) -> None:
        super().on_resize()
        self.show(*self._args)


class NvmlBanner(TextStatic):
    def show(self, machine: MachineSnapshot | None) -> None:
        text = banner_text(machine)
        self.set_class(text is not None, "-visible")
        self.show_text(text if text is not None else "")
