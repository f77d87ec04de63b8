"""The anatomy pane's `l`: `anatomy-top plan --like PID` in a subprocess, its text on a screen (the monitor
never imports torch), failures as their one line, the subprocess killed when the screen closes first."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
from textual.app import App

from tui.screens import plan_like
from tui.screens.plan_like import PlanLikeScreen


class _Host(App[None]):
    pass


async def _shown(screen: PlanLikeScreen) -> str:
    deadline = time.monotonic() + 30
    while screen.result is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert screen.result is not None
    return screen.result


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("print('Plan vs measured — PID 7'); print('  Weights  1 MiB  1 MiB  exact')", "exact"),
        (
            "import sys; sys.stderr.write('process 7 publishes no anatomy\\n'); sys.exit(2)",
            "publishes no anatomy",
        ),
    ],
)
async def test_the_plan_text_is_shown(
    script: str, expected: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: dict[str, object] = {}

    def command(pid: int) -> list[str]:
        seen["pid"] = pid
        return [sys.executable, "-c", script]

    monkeypatch.setattr(plan_like, "plan_command", command)
    app = _Host()
    async with app.run_test(size=(100, 30)):
        screen = PlanLikeScreen(7, tmp_path)
        await app.push_screen(screen)
        text = await _shown(screen)
        assert expected in text and seen["pid"] == 7


def test_the_command_is_plan_like() -> None:
    assert plan_like.plan_command(42)[-3:] == ["anatomy.plan_cli", "--like", "42"]
