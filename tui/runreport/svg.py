"""A chart as inline SVG: no script, no font or style fetched, so the page opens offline anywhere.

Each chart is ``<svg class="chart" id=... data-points=N>``; each drawn series is a ``path`` (stacked
area) or ``polyline`` (line) with ``data-series`` naming it, so a test (or a script) can find the data in
the DOM.
"""

from __future__ import annotations

from html import escape

from tui.runreport.charts import Chart


def _pts(points: tuple[tuple[float, float], ...]) -> str:
    return " ".join(f"{x:g},{y:g}" for x, y in points)


def render(chart: Chart) -> str:
    out = [
        f'<svg class="chart" id="{escape(chart.id)}" data-points="{chart.points}" '
        f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {chart.width} {chart.height}" '
        f'width="{chart.width}" height="{chart.height}" role="img" aria-label="{escape(chart.title)}">'
    ]
    for s in chart.shapes():
        if s.kind == "polygon":
            d = "M" + " L".join(f"{x:g},{y:g}" for x, y in s.points) + "Z"
            out.append(
                f'<path data-series="{escape(s.name)}" d="{d}" fill="{s.colour}" fill-opacity="0.85" '
                f'stroke="{s.colour}" stroke-width="0.5"><title>{escape(s.name)}</title></path>'
            )
        elif s.kind == "line":
            out.append(
                f'<polyline data-series="{escape(s.name)}" points="{_pts(s.points)}" fill="none" '
                f'stroke="{s.colour}" stroke-width="1.5"><title>{escape(s.name)}</title></polyline>'
            )
        elif s.kind == "rule":
            (ax, ay), (bx, by) = s.points
            dash = ' stroke-dasharray="4 3"' if s.name == "event" else ""
            title = f"<title>{escape(s.text)}</title>" if s.text else ""
            cls = ' class="event"' if s.name == "event" else ""
            out.append(
                f'<line{cls} x1="{ax:g}" y1="{ay:g}" x2="{bx:g}" y2="{by:g}" stroke="{s.colour}" '
                f'stroke-width="{1.5 if s.name == "event" else 1}"{dash}>{title}</line>'
            )
        elif s.kind == "text":
            ((x, y),) = s.points
            out.append(
                f'<text x="{x:g}" y="{y:g}" fill="{s.colour}" font-size="11" '
                f'text-anchor="{s.anchor}">{escape(s.text)}</text>'
            )
    out.append("</svg>")
    return "".join(out)
