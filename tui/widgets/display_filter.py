"""The last step before the terminal: drop every colour (NO_COLOR, TERM=dumb) and turn every character
into ASCII (--ascii, a locale that is not UTF-8), for everything on screen — our widgets and Textual's
own (borders, scrollbars, the input cursor, notifications) alike.

Textual's own NO_COLOR support maps colours to greys, which still sends 24-bit colour escapes and makes
the memory bar's segments near-identical greys; this filter sends none, and the views draw what colour
told apart with characters and attributes instead (``tui.view.bars``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from rich.segment import Segment
from rich.style import Style
from textual.color import Color
from textual.filter import LineFilter, Monochrome, NoColor
from textual.scrollbar import ScrollBarRender

from tui.terminal import Display, to_ascii


@lru_cache(maxsize=4096)
def colourless(style: Style) -> Style:
    """``style`` with no foreground or background colour; attributes (bold, reverse, underline) and
    mouse metadata kept."""
    plain = style.without_color
    meta = style._meta  # without_color drops it; Textual's clickable regions need it
    return plain + Style.from_meta(style.meta) if meta else plain


class DisplayFilter(LineFilter):
    def __init__(self, display: Display) -> None:
        super().__init__(enabled=display.plain or display.ascii)
        self.display = display

    def apply(self, segments: list[Segment], background: Color) -> list[Segment]:
        plain, ascii_only = self.display.plain, self.display.ascii
        out: list[Segment] = []
        for text, style, control in segments:
            if control:
                out.append(Segment(text, style, control))
                continue
            if ascii_only and not text.isascii():
                text = to_ascii(text)
            if plain and style is not None:
                style = colourless(style)
            out.append(Segment(text, style, control))
        return out


class PlainScrollBarRender(ScrollBarRender):
    """Scrollbars without the partial-cell glyphs at the thumb's ends: the thumb is reverse video, which
    reads without colour and in ASCII."""

    VERTICAL_BARS = [" "] * 8
    HORIZONTAL_BARS = [" "] * 8


def install(app_filters: list[LineFilter], display: Display) -> Callable[[], None]:
    """Replace Textual's own NO_COLOR filters with ours (in place, on the app's filter list) and, when
    colour or Unicode is off, draw scrollbars without partial-cell glyphs (a class-wide setting in
    Textual: the returned function puts the previous one back)."""
    from textual.scrollbar import ScrollBar

    app_filters[:] = [f for f in app_filters if not isinstance(f, (NoColor, Monochrome, DisplayFilter))]
    app_filters.append(DisplayFilter(display))
    previous = ScrollBar.renderer
    if display.plain or display.ascii:
        ScrollBar.renderer = PlainScrollBarRender

    def restore() -> None:
        ScrollBar.renderer = previous

    return restore
