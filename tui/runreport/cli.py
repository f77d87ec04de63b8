"""``anatomy-top runs`` (the recorded runs) and ``anatomy-top report RUN`` (one as an HTML page / PNG)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from anatomy import runs
from anatomy.recorder import record_dir
from anatomy.units import fmt_bytes
from tui.startup import PROG


def _directory(arg: str | None) -> Path:
    if arg:
        return Path(arg).expanduser()
    return record_dir(True) or Path(".")


def runs_main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(
        prog=f"{PROG} runs",
        description="List the runs the flight recorder kept, newest first (a job's ranks as one run).",
    )
    ap.add_argument("--json", action="store_true", help="a JSON list for scripts")
    ap.add_argument(
        "--dir",
        help="where the records are (default: $ANATOMY_TOP_RECORD or ~/.local/state/anatomy-top/runs)",
    )
    args = ap.parse_args(list(argv))
    groups = runs.list_runs(_directory(args.dir))
    if args.json:
        print(json.dumps([g.to_json() for g in groups], indent=1))
        return 0
    if not groups:
        print(f"no recorded runs in {_directory(args.dir)}")
        return 0
    header = (
        f"{'ID':<44} {'STARTED':<19} {'HOST':<12} {'MODEL':<28} {'RANKS':>5} {'STEPS':>9} {'PEAK':>10}  ENDED"
    )
    print(header)
    for g in groups:
        peak = g.peak_bytes
        print(
            f"{g.id[:44]:<44} {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(g.started_at)):<19} "
            f"{g.first.host[:12]:<12} {g.first.model_class[:28]:<28} {len(g.runs):>5} {g.steps:>9,} "
            f"{fmt_bytes(peak) if peak is not None else '—':>10}  {g.ended}"
        )
    return 0


def report_main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(
        prog=f"{PROG} report",
        description="Write a recorded run as one self-contained HTML page (opens offline), or a PNG.",
    )
    ap.add_argument(
        "run", help="an id from 'anatomy-top runs' (or a unique prefix), a record file, or 'last'"
    )
    ap.add_argument("-o", "--output", help="the HTML file (default: <id>.html in the current directory)")
    ap.add_argument("--png", help="also (or only, with -o -) write the main charts as a PNG picture")
    ap.add_argument("--dir", help="where the records are (default: as 'anatomy-top runs')")
    args = ap.parse_args(list(argv))
    try:
        group = runs.resolve(args.run, _directory(args.dir))
    except (LookupError, OSError, ValueError) as exc:
        print(f"{PROG} report: {exc}", file=sys.stderr)
        return 1
    from tui.runreport import page

    if args.output != "-":
        out = Path(args.output) if args.output else Path(f"{group.id}.html")
        out.write_text(page.render(group), encoding="utf-8")
        print(f"{out} ({out.stat().st_size / 1024:.0f} KiB)")
    if args.png:
        from tui.runreport import png

        missing = png.available()
        if missing is not None:
            print(f"{PROG} report: {missing}", file=sys.stderr)
            return 1
        rows = page.picture_rows(group)
        png.write(Path(args.png), rows, f"{group.first.model_class} - {group.id} ({group.ended})")
        print(args.png)
    return 0
