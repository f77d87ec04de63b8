"""The report of a long run: a 100,000-step record written by the real recorder (synthetic snapshots,
one recorded every 5 steps, as a 0.1 s step at the 0.5 s publish interval), then
``anatomy-top report`` on it: the record's size, the page's size, the time to read and render, the PNG.

Usage: python benchmarks/bench_report.py [--steps 100000] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth_record import synthesize

from anatomy import runs
from tui.runreport import page, png


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--out", help="keep the record, page and picture here")
    args = ap.parse_args()
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="anatomy-bench-report-"))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    path = synthesize(out / "runs", args.steps, oom=True)
    t_write = time.perf_counter() - t0
    size = path.stat().st_size
    t0 = time.perf_counter()
    group = runs.resolve(str(path))
    t_read = time.perf_counter() - t0
    t0 = time.perf_counter()
    html = page.render(group)
    t_render = time.perf_counter() - t0
    html_path = out / "report.html"
    html_path.write_text(html, encoding="utf-8")
    t0 = time.perf_counter()
    png_path = out / "report.png"
    png.write(png_path, page.picture_rows(group), group.id)
    t_png = time.perf_counter() - t0
    run = group.first
    print(
        f"record: {args.steps:,} steps written in {t_write:.1f} s -> {size / 2**20:.2f} MiB "
        f"({size / args.steps * 1000 / 1024:.1f} KiB per 1,000 steps), {len(run.rows):,} step rows "
        f"(standing for {run.steps:,} steps), {len(run.snapshots):,} snapshots kept"
    )
    print(
        f"report: read {t_read:.2f} s + render {t_render:.2f} s = {t_read + t_render:.2f} s; "
        f"HTML {len(html.encode()) / 1024:.0f} KiB; "
        f"PNG {t_png:.2f} s, {png_path.stat().st_size / 1024:.0f} KiB"
    )
    print(f"files in {out}")


if __name__ == "__main__":
    main()
