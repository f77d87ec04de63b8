"""A recorded run (one process, or a job's ranks side by side) as one self-contained HTML page.

Everything is inline: the charts are SVG, the style one ``<style>`` block, no script, no font, no URL: the
page opens offline on a login node and can be mailed as it is. Memory components take the monitor's
names (the vocabulary) and colours (``tui.view.bars``, as the README's screenshots render them).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from rich.color import Color
from rich.terminal_theme import SVG_EXPORT_THEME

from anatomy.protocol import Hello, Snapshot, Suggestion
from anatomy.runs import Run, RunGroup
from anatomy.units import fmt_bytes
from anatomy.vocabulary import OP_GROUP_LABELS, Component, OpGroup
from tui.component_styles import COMPONENT_STYLES
from tui.format import fmt_duration, fmt_seconds
from tui.runreport import svg
from tui.runreport.charts import Chart, Event, Series, thin
from tui.sources.jobs import STRAGGLER_RATIO

PHASE_COLOURS = {"forward": "#608ab1", "backward": "#d0b344", "optimizer": "#98729f", "other": "#9a9b99"}
OP_GROUP_COLOURS = {
    OpGroup.CONTRACTION: "#cc6666",
    OpGroup.NORMALIZATION: "#68a0b3",
    OpGroup.ELEMENTWISE: "#98a84b",
    OpGroup.OPTIMIZER: "#98729f",
    OpGroup.OTHER: "#9a9b99",
}
LEAD_UP = 20  # steps of an OOM run shown before the OOM


def component_colour(component: Component) -> str:
    style = COMPONENT_STYLES.get(component, "grey58")
    return Color.parse(style).get_truecolor(SVG_EXPORT_THEME).hex


def _label(rank_run: Run) -> str:
    return f"rank {rank_run.rank}" if rank_run.rank is not None else f"pid {rank_run.pid}"


# -- the charts of one rank ---------------------------------------------------------------------


def events_of(run: Run) -> list[Event]:
    out = []
    for (_, step, hello), (_, _, before) in zip(run.hellos[1:], run.hellos, strict=False):
        out.append(Event(float(step or 0), "set-up change: " + hello_change(before, hello)))
    for snap in run.ooms:
        out.append(Event(float(snap.step), f"OOM: {snap.oom or ''}"[:200], oom=True))
    return out


def hello_change(before: Hello, after: Hello) -> str:
    fields = (
        "precision",
        "optimizer",
        "optimizer_class",
        "model_class",
        "parameter_count",
        "dtype",
        "device",
    )
    changed = [
        f"{f} {getattr(before, f)} → {getattr(after, f)}"
        for f in fields
        if getattr(before, f) != getattr(after, f)
    ]
    return ", ".join(changed) or "the hello changed"


def memory_chart(run: Run, suffix: str = "") -> Chart:
    snaps = run.snapshots
    xs = [float(s.step) for s in snaps]
    stacked = []
    for c in Component:
        ys = [s.memory.get(c) for s in snaps]
        if any(y is not None for y in ys):
            tx, ty = thin(xs, [float(y) if y is not None else None for y in ys])
            stacked.append(Series(c.label, component_colour(c), tx, ty))
    px, py = thin([float(r.step) for r in run.rows], [r.peak_bytes for r in run.rows], how="max")
    lines = [Series("step peak", "#ffffff", px, [float(p) if p is not None else None for p in py])]
    return Chart(f"memory{suffix}", "Memory by component", "bytes", stacked, lines, events_of(run))


def phase_chart(run: Run, suffix: str = "") -> Chart:
    rows = run.rows
    xs = [float(r.step) for r in rows]
    parts: dict[str, list[float | None]] = {k: [] for k in PHASE_COLOURS}
    for r in rows:
        known = [r.forward_s, r.backward_s, r.optimizer_s]
        parts["forward"].append(r.forward_s)
        parts["backward"].append(r.backward_s)
        parts["optimizer"].append(r.optimizer_s)
        rest = None if r.step_s is None else max(r.step_s - sum(k or 0.0 for k in known), 0.0)
        parts["other"].append(rest)
    stacked = []
    for name, ys in parts.items():
        if any(y is not None for y in ys):
            tx, ty = thin(xs, ys)
            stacked.append(Series(name, PHASE_COLOURS[name], tx, ty))
    return Chart(f"phases{suffix}", "Step time by phase", "seconds", stacked, [], events_of(run))


def op_group_chart(run: Run, suffix: str = "") -> Chart:
    seen: dict[int, Snapshot] = {}
    for s in run.snapshots:
        if s.op_groups:
            seen[s.op_groups_step if s.op_groups_step is not None else s.step] = s
    xs = [float(k) for k in sorted(seen)]
    stacked = []
    totals = [sum((g.time_s or 0.0) for g in (seen[int(x)].op_groups or {}).values()) for x in xs]
    for group in OpGroup:
        ys: list[float | None] = []
        for x, total in zip(xs, totals, strict=True):
            stat = (seen[int(x)].op_groups or {}).get(group)
            ys.append((stat.time_s or 0.0) / total if stat is not None and total > 0 else None)
        if any(ys):
            tx, ty = thin(xs, ys)
            stacked.append(Series(OP_GROUP_LABELS[group], OP_GROUP_COLOURS.get(group, "#9a9b99"), tx, ty))
    return Chart(f"opgroups{suffix}", "Op-group shares of step time", "share", stacked, [], events_of(run))


def throughput_chart(run: Run, suffix: str = "") -> Chart:
    xs, ys = thin([float(r.step) for r in run.rows], [r.samples_per_s for r in run.rows])
    return Chart(
        f"throughput{suffix}",
        "Samples/s",
        "rate",
        [],
        [Series("samples/s", "#98a84b", xs, ys)],
        events_of(run),
    )


def mfu_chart(run: Run, suffix: str = "") -> Chart:
    snaps = [s for s in run.snapshots if s.mfu is not None]
    xs, ys = thin([float(s.step) for s in snaps], [s.mfu for s in snaps])
    return Chart(f"mfu{suffix}", "MFU", "ratio", [], [Series("MFU", "#cc6666", xs, ys)], events_of(run))


def same_scale(charts: list[Chart]) -> list[Chart]:
    """One y scale across the ranks' charts: side by side, the taller is the larger."""
    shared = max((c.data_max() for c in charts), default=0.0)
    for c in charts:
        c.y_max = shared
    return charts


CHARTS = (memory_chart, phase_chart, op_group_chart, throughput_chart, mfu_chart)
MAIN_CHARTS = (memory_chart, phase_chart, throughput_chart)


def picture_rows(group: RunGroup) -> list[list[Chart]]:
    """The main charts for ``--png``: a row per chart, a column per rank (named in each title)."""
    rows = []
    for make in MAIN_CHARTS:
        charts = same_scale([make(run) for run in group.runs])
        if len(group.runs) > 1:
            for run, chart in zip(group.runs, charts, strict=True):
                chart.title += f" - {_label(run)}"
        rows.append(charts)
    return rows


# -- the page -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankSummary:
    run: Run
    median_step_s: float | None
    slowest: bool = False
    straggler: bool = False


def summaries(group: RunGroup) -> list[RankSummary]:
    medians = []
    for run in group.runs:
        times = [r.step_s for r in run.rows if r.step_s is not None]
        medians.append(statistics.median(times) if times else None)
    out = [RankSummary(run, m) for run, m in zip(group.runs, medians, strict=True)]
    measured = [(m, i) for i, m in enumerate(medians) if m is not None]
    if len(group.runs) > 1 and len(measured) > 1:
        slow, at = max(measured)
        others = [m for m, i in measured if i != at]
        straggler = slow >= STRAGGLER_RATIO * statistics.median(others)
        out[at] = RankSummary(group.runs[at], slow, slowest=True, straggler=straggler)
    return out


def peak_snapshot(run: Run) -> Snapshot | None:
    snaps = [s for s in run.snapshots + run.ooms if s.peak_bytes is not None]
    return (
        max(snaps, key=lambda s: s.peak_bytes or 0)
        if snaps
        else (run.snapshots[-1] if run.snapshots else None)
    )


def _split_html(snap: Snapshot | None) -> str:
    if snap is None:
        return "<p class=muted>no snapshot recorded</p>"
    split = snap.at_peak or snap.memory
    parts = [(c, split.get(c)) for c in Component if split.get(c)]
    total = sum(v or 0 for _, v in parts) or 1
    bar = "".join(
        f'<span style="width:{(v or 0) / total * 100:.2f}%;background:{component_colour(c)}" '
        f'title="{escape(c.label)}"></span>'
        for c, v in parts
    )
    rows = "".join(
        f'<tr><td><i style="background:{component_colour(c)}"></i>'
        f"{escape(c.label)}</td>"
        f"<td class=num>{fmt_bytes(v or 0)}</td><td class=num>{(v or 0) / total * 100:.1f}%</td></tr>"
        for c, v in parts
    )
    what = "held at the moment of the peak" if snap.at_peak else "each component at its maximum"
    return (
        f"<p>step {snap.step}: peak {fmt_bytes(snap.peak_bytes or total)}"
        f"{' in ' + escape(snap.peak_phase) if snap.peak_phase else ''} ({what})</p>"
        f'<div class="bar">{bar}</div><table class="split">{rows}</table>'
    )


def _suggestions(snaps: Sequence[Snapshot]) -> list[Suggestion]:
    out: dict[str, Suggestion] = {}
    for s in snaps:
        for sug in s.suggestions:
            out.setdefault(sug.rule, sug)
    return list(out.values())


def _oom_html(run: Run) -> str:
    if not run.ooms:
        return ""
    oom = run.ooms[0]
    lead = [r for r in run.rows if r.step < oom.step][-LEAD_UP:]
    body = []
    prev = None
    for r in lead:
        delta = "" if prev is None or r.peak_bytes is None or prev is None else fmt_bytes(r.peak_bytes - prev)
        body.append(
            f"<tr><td class=num>{r.step}</td><td class=num>{fmt_seconds(r.step_s)}</td>"
            f"<td class=num>{fmt_bytes(r.peak_bytes) if r.peak_bytes is not None else '—'}</td>"
            f"<td class=num>{delta}</td></tr>"
        )
        prev = r.peak_bytes if r.peak_bytes is not None else prev
    return (
        f'<div class="oom"><h3>{escape(_label(run))}: out of memory at step {oom.step}</h3>'
        f"<pre>{escape(oom.oom or '')}</pre><h4>The steps that led to it</h4>"
        '<table class="leadup"><tr><th>step</th><th>step time</th><th>peak</th><th>Δ peak</th></tr>'
        + "".join(body)
        + f"</table><h4>Memory at the OOM</h4>{_split_html(oom)}</div>"
    )


STYLE = """
body{background:#292929;color:#e0e0e0;font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:20px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px;border-bottom:1px solid #444}
h3{font-size:14px;margin:8px 0} h4{font-size:13px;margin:8px 0 4px}
.meta,.muted{color:#a0a0a0} .ranks{display:flex;flex-wrap:wrap;gap:14px}
figure{margin:0;background:#1e1e1e;border:1px solid #3a3a3a;padding:6px}
figcaption{font-size:12px;color:#c0c0c0;margin-bottom:2px}
.legend{font-size:12px;margin:4px 0 0} .legend i,.split i{display:inline-block;width:10px;height:10px;
margin:0 4px 0 10px;vertical-align:middle}
table{border-collapse:collapse;font-size:13px}
td,th{padding:2px 8px;border-bottom:1px solid #3a3a3a;text-align:left}
.num{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:flex;height:16px;width:520px;border:1px solid #555;margin:4px 0}
.bar span{display:block;height:100%}
.badge{padding:1px 6px;border-radius:3px;font-size:12px}
.finished{background:#2e5d34} .oom,.killed,.crashed{background:#6b2222} .running{background:#2a4f6b}
div.oom{background:#3a2222;border:1px solid #7a3333;padding:8px;margin:8px 0}
.straggler{color:#ff9040;font-weight:bold} pre{white-space:pre-wrap}
"""


def _legend(chart: Chart) -> str:
    items = chart.stacked + chart.lines
    return (
        '<div class="legend">'
        + "".join(f'<i style="background:{s.colour}"></i>{escape(s.name)}' for s in items)
        + "</div>"
    )


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def render(group: RunGroup) -> str:
    first = group.first
    hello = first.hello
    ranks = summaries(group)
    title = f"{first.model_class or 'training run'} — {group.id}"
    head = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{escape(first.model_class or 'training run')} "
        f'<span class="badge {escape(group.ended)}">{escape(group.ended)}</span></h1>',
    ]
    meta = [f"run {escape(group.id)}", f"host {escape(first.host)}", f"started {_when(group.started_at)}"]
    meta.append(f"{group.steps:,} steps")
    meta.append(f"ran {fmt_duration(max(r.last_time for r in group.runs) - group.started_at)}")
    if hello is not None:
        meta += [
            escape(hello.device_name or hello.device),
            escape(hello.precision),
            escape(hello.optimizer_class or hello.optimizer),
            f"{hello.parameter_count:,} parameters",
        ]
    peak = group.peak_bytes
    if peak is not None:
        meta.append(f"peak {fmt_bytes(peak)}")
    head.append(f'<p class="meta">{" · ".join(meta)}</p>')
    for run in group.runs:
        if run.error is not None:
            who = f"rank {run.rank} " if len(group.runs) > 1 else ""
            head.append(f'<p class="meta">{who}crashed on <code>{escape(run.error)}</code></p>')
    body: list[str] = []
    if len(group.runs) > 1:
        body.append(
            "<h2>Ranks</h2><table><tr><th>rank</th><th>pid</th><th>steps</th><th>median step</th>"
            "<th>peak</th><th>ended</th><th></th></tr>"
        )
        for s in ranks:
            mark = ""
            if s.slowest:
                mark = '<span class="straggler">straggler</span>' if s.straggler else "slowest"
            body.append(
                f"<tr><td>{escape(str(s.run.rank))}</td><td>{s.run.pid}</td>"
                f"<td class=num>{s.run.steps:,}</td>"
                f"<td class=num>{fmt_seconds(s.median_step_s)}</td>"
                f"<td class=num>{fmt_bytes(s.run.peak_bytes) if s.run.peak_bytes is not None else '—'}</td>"
                f"<td>{escape(s.run.ended)}</td><td>{mark}</td></tr>"
            )
        body.append("</table>")
    for make in CHARTS:
        charts = [make(run, f"-r{run.rank}" if run.rank is not None else "") for run in group.runs]
        same_scale(charts)
        body.append(f"<h2>{escape(charts[0].title)}</h2><div class=ranks>")
        for run, chart, summary in zip(group.runs, charts, ranks, strict=True):
            cap = _label(run) if len(group.runs) > 1 else ""
            if summary.straggler:
                cap += ' <span class="straggler">straggler</span>'
            body.append(
                f'<figure style="max-width:{chart.width}px"><figcaption>{cap}</figcaption>'
                f"{svg.render(chart)}{_legend(chart)}</figure>"
            )
        body.append("</div>")
    body.append("<h2>Split at the peak</h2><div class=ranks>")
    for run in group.runs:
        cap = _label(run) if len(group.runs) > 1 else ""
        body.append(f"<figure><figcaption>{cap}</figcaption>{_split_html(peak_snapshot(run))}</figure>")
    body.append("</div>")
    body.append(_events_html(group))
    sugg = _suggestions([s for r in group.runs for s in (r.snapshots[-1:] + r.ooms)])
    body.append("<h2>Suggestions</h2>")
    if sugg:
        body.append("<ul class=suggestions>")
        for sug in sugg:
            saving = f" — saves {fmt_bytes(sug.saving_bytes)} at the peak" if sug.saving_bytes else ""
            body.append(
                f"<li><b>{escape(sug.title)}</b>{saving}<br>"
                f"<span class=muted>{escape(sug.detail)}</span></li>"
            )
        body.append("</ul>")
    else:
        body.append("<p class=muted>none</p>")
    ooms = "".join(_oom_html(r) for r in group.runs)
    if ooms:
        body.append(f"<h2>Out of memory</h2>{ooms}")
    foot = (
        f'<p class="muted">anatomy-top report · {len(group.runs)} record file(s): '
        + ", ".join(escape(r.path.name) for r in group.runs)
        + "</p></body></html>"
    )
    return "".join(head + body) + foot


def _events_html(group: RunGroup) -> str:
    rows = []
    for run in group.runs:
        at = {float(step or 0): t for t, step, _ in run.hellos}
        for e in events_of(run):
            when = at.get(e.x)
            rows.append((e.x, _label(run), e.label, when, e.oom))
    if not rows:
        return "<h2>Events</h2><p class=muted>no set-up change, no OOM</p>"
    out = ["<h2>Events</h2><table class=events><tr><th>step</th><th>rank</th><th>time</th><th>what</th></tr>"]
    for x, who, label, when, oom in sorted(rows, key=lambda r: r[0]):
        cls = ' class="oomrow"' if oom else ""
        out.append(
            f"<tr{cls}><td class=num>{x:,.0f}</td><td>{escape(who)}</td>"
            f"<td>{_when(when) if when else ''}</td><td>{escape(label)}</td></tr>"
        )
    out.append("</table>")
    return "".join(out)
