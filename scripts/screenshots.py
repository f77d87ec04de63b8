"""Regenerate the README's screenshots: screenshots/{wide,medium,narrow,ranks,demo}.{svg,png}.

    .venv/bin/python scripts/screenshots.py [--out screenshots]

Each screen is rendered headless by the real app (``App.run_test``) at the sizes the README promises:
wide (160x45, side by side), medium (120x40, one pane, compact GPU table), narrow (80x24) and ranks
(160x45) from the frozen 8-GPU box in tests/tui/frozen.py; demo (160x45) from a live `--demo` (simulated
GPUs, real CPU training job). Saved as SVG with ``export_screenshot()`` and converted to PNG with
cairosvg when it is installed (it renders faithfully with Debian's fonts-firacode; without cairosvg only
the SVGs are written and the script says so). Exit status 0 when every SVG was written.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "tui"))

import frozen  # noqa: E402  (the test suite's frozen data)
from textual.pilot import Pilot  # noqa: E402

from tui.app import AnatomyTopApp  # noqa: E402
from tui.widgets.process_table import ProcessTable  # noqa: E402


async def _select(pilot: Pilot[Any], pid: int) -> None:
    table = pilot.app.query_one(ProcessTable)
    key = next(k for k, row in table.rows_by_key.items() if row.pid == pid)
    table.move_cursor(row=table.get_row_index(key))
    await pilot.pause()


async def _wide(pilot: Pilot[Any]) -> None:
    await _select(pilot, frozen.TRAIN_PID)


async def _medium(pilot: Pilot[Any]) -> None:
    await _select(pilot, frozen.TRAIN_PID)


async def _narrow(pilot: Pilot[Any]) -> None:
    await _select(pilot, frozen.TRAIN_PID)  # training jobs sort first: in view at 80x24


async def _ranks(pilot: Pilot[Any]) -> None:
    await _select(pilot, frozen.DDP_PIDS[1])


@dataclass(frozen=True)
class Shot:
    name: str
    size: tuple[int, int]
    prepare: Callable[[Pilot[Any]], Awaitable[None]]


SHOTS = (
    Shot("wide", (160, 45), _wide),
    Shot("medium", (120, 40), _medium),
    Shot("narrow", (80, 24), _narrow),
    Shot("ranks", (160, 45), _ranks),
)


async def render_live_demo(size: tuple[int, int] = (160, 45)) -> str:
    """What `anatomy-top --demo` shows: the simulated 8-GPU box and the real CPU training job publishing
    through the real hook (not frozen data, so its numbers differ from run to run)."""
    from tui.demo import start_demo
    from tui.sources.anatomy_source import AnatomySource
    from tui.sources.machine import MachineSource
    from tui.startup import install_simulation

    handle = start_demo(install_signal_handlers=False)
    try:
        reason = install_simulation()  # as `anatomy-top --demo` does at start-up
        if reason is not None:
            raise RuntimeError(reason)
        if not handle.wait_until_publishing(90):
            raise RuntimeError("the demo's training job did not publish within 90 s")
        app = AnatomyTopApp(
            MachineSource(),
            AnatomySource(),
            interval=2.0,
            handle_signals=False,
            starting_pid=handle.train_pid,
        )
        async with app.run_test(size=size) as pilot:
            await app.wait_for_poll(count=6, timeout=60)
            await pilot.pause()
            return app.export_screenshot(title="anatomy-top --demo")
    finally:
        handle.stop()


async def render(shot: Shot) -> str:
    app = AnatomyTopApp(
        frozen.FakeMachineSource(),
        frozen.FakeAnatomySource(),
        interval=2.0,
        handle_signals=False,
        host_lookup=frozen.frozen_host_lookup,
    )
    async with app.run_test(size=shot.size) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        await shot.prepare(pilot)
        await pilot.pause()
        return app.export_screenshot(title=f"anatomy-top — {shot.name}")


def to_png(svg: str, path: Path) -> bool:
    try:
        import cairosvg  # type: ignore[import-not-found]
    except ImportError:
        return False
    cairosvg.svg2png(bytestring=svg.encode(), write_to=str(path))
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "screenshots")
    args = parser.parse_args(argv)
    os.environ["TZ"] = "UTC"  # the header shows the frozen time in the local zone
    time.tzset()
    args.out.mkdir(parents=True, exist_ok=True)
    missing_png = False
    renders = [(shot.name, lambda shot=shot: render(shot)) for shot in SHOTS]
    renders.append(("demo", render_live_demo))
    for name, make in renders:
        svg = asyncio.run(make())
        svg_path = args.out / f"{name}.svg"
        svg_path.write_text(svg, encoding="utf-8")
        png_path = args.out / f"{name}.png"
        if to_png(svg, png_path):
            print(f"wrote {svg_path} and {png_path}")
        else:
            missing_png = True
            print(f"wrote {svg_path}")
    if missing_png:
        print(
            "PNGs not written: install cairosvg (pip install cairosvg) and the Fira Code font "
            "(Debian: apt-get install fonts-firacode), then run again",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
