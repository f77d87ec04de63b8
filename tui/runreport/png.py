"""The main charts as one PNG, drawn with Pillow from the same geometry as the page's SVG: no browser,
no Cairo. Pillow is an optional dependency (the ``report`` extra); without it ``--png`` says so."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tui.runreport.charts import Chart

BACKGROUND = "#1b1b1b"
TITLE = "#e8e8e8"
TITLE_H = 22


def available() -> str | None:
    """None when PNGs can be drawn, else why not."""
    try:
        import PIL  # noqa: F401
    except ImportError:
        return "--png needs Pillow (pip install 'anatomy-top[report]')"
    return None


def write(path: Path, rows: Sequence[Sequence[Chart]], heading: str) -> None:
    """``rows`` of charts (a rank per column) under ``heading``, to ``path``."""
    from PIL import Image, ImageDraw, ImageFont

    cols = max((len(r) for r in rows), default=1)
    cw = max((c.width for r in rows for c in r), default=560)
    ch = max((c.height for r in rows for c in r), default=230)
    width = cols * cw
    height = 30 + len(rows) * (ch + TITLE_H)
    img = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=11)
    big = ImageFont.load_default(size=15)
    draw.text((8, 6), heading, fill=TITLE, font=big)
    for r, row in enumerate(rows):
        for c, chart in enumerate(row):
            ox, oy = c * cw, 30 + r * (ch + TITLE_H)
            draw.text((ox + 8, oy + 4), chart.title, fill=TITLE, font=font)
            oy += TITLE_H
            for s in chart.shapes():
                pts = [(ox + x, oy + y) for x, y in s.points]
                if s.kind == "polygon":
                    draw.polygon(pts, fill=s.colour)
                elif s.kind == "line":
                    draw.line(pts, fill=s.colour, width=2)
                elif s.kind == "rule":
                    draw.line(pts, fill=s.colour, width=2 if s.name == "event" else 1)
                elif s.kind == "text":  # Pillow's built-in font has no µ
                    s = replace(s, text=s.text.replace("µ", "u"))
                    anchor = {"start": "ls", "middle": "ms", "end": "rs"}[s.anchor]
                    draw.text(pts[0], s.text, fill=s.colour, font=font, anchor=anchor)
    img.save(path, format="PNG", optimize=True)
