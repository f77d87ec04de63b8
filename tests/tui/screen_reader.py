"""What a headless app's screen shows, for the tests. Textual has no public read-out of the composed
screen as text (``export_screenshot`` draws an SVG): this is the one place that reads its compositor."""

from __future__ import annotations

from typing import Any

from rich.style import Style
from textual.app import App
from textual.strip import Strip


def screen_strips(app: App[Any]) -> list[Strip]:
    return list(app.screen._compositor.render_strips())


def screen_text(app: App[Any]) -> str:
    """The characters on screen, one line per terminal row (what a user sees, styles dropped)."""
    return "\n".join("".join(segment.text for segment in strip) for strip in screen_strips(app))


def screen_segments(app: App[Any]) -> list[tuple[str, Style | None]]:
    return [(segment.text, segment.style) for strip in screen_strips(app) for segment in strip]
