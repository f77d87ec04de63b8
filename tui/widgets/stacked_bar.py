"""One stacked bar of where a process's memory goes: a single widget, one colour per component."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from anatomy.vocabulary import Component
from tui.view.bars import component_mark, split_cells

Segment = tuple[Component, int]


class StackedBar(Widget):
    """Renders ``segments`` (component, bytes) as block characters across its width. Components with
    no bytes (or unmeasured ones, which callers leave out) take no room."""

    segments: reactive[tuple[Segment, ...]] = reactive((), layout=False)

    def set_segments(self, segments: Sequence[Segment]) -> None:
        value = tuple((c, int(b)) for c, b in segments if b and b > 0)
        if value != self.segments:
            self.segments = value

    def render(self) -> Text:
        width = self.size.width
        if not self.segments:
            return Text("no memory measured yet", style="bright_black")
        cells = split_cells([b for _, b in self.segments], width)
        plain = bool(getattr(getattr(self.app, "caps", None), "plain", False))
        text = Text()
        for (component, _), n in zip(self.segments, cells, strict=True):
            if n:
                mark, style = component_mark(component, plain)
                text.append(mark * n, style=style)
        return text
