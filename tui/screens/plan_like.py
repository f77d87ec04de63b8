"""Plan vs measured for the training process the anatomy pane shows: ``anatomy-top plan --like PID`` run
in a subprocess (the monitor never imports torch; the plan needs it), its text shown as it printed it.

The subprocess reads the same runtime directory as the monitor (``ANATOMY_TOP_DIR`` set to it) and is
killed if the screen is closed before it ends. Its output is plain text from our own program, but it names
a model class and a config another process sent: every line goes through ``clean``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from tui.sanitize import clean

PLAN_TIMEOUT_S = 300.0


def plan_command(pid: int) -> list[str]:
    return [sys.executable, "-m", "anatomy.plan_cli", "--like", str(pid)]


class PlanLikeScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "escape,q,l", "close", "Close", show=False, id="plan-like.close", tooltip="close (ends the plan)"
        ),
    ]
    CSS_PATH = "screens.tcss"

    def __init__(self, pid: int, directory: Path | None = None) -> None:
        super().__init__()
        self.pid = pid
        self.directory = directory
        self.result: str | None = None  # the text shown once the plan ended (tests read it)
        self._proc: subprocess.Popen[str] | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="plan-like-body"):
            yield Static(Text(f"Plan vs measured: PID {self.pid}", style="bold"), id="plan-like-title")
            yield Static(
                Text(
                    f"anatomy-top plan --like {self.pid}: the plan of this job (its config and batch, from "
                    "its hook) beside what the hook measured · ↑ ↓ scroll · escape closes",
                    style="bright_black",
                ),
                id="plan-like-note",
            )
            yield Static(
                Text("planning… (a fake training step: seconds)", style="yellow"), id="plan-like-text"
            )

    def on_mount(self) -> None:
        self.query_one("#plan-like-body").focus()
        self.run_worker(self._plan, thread=True, exclusive=True)

    def _plan(self) -> None:
        env = dict(os.environ)
        if self.directory is not None:
            env["ANATOMY_TOP_DIR"] = str(self.directory)
        try:
            self._proc = subprocess.Popen(
                plan_command(self.pid),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
            )
            out, err = self._proc.communicate(timeout=PLAN_TIMEOUT_S)
            code = self._proc.returncode
        except subprocess.TimeoutExpired:
            self._kill()
            out, err, code = "", f"the plan took more than {PLAN_TIMEOUT_S:.0f} s", 1
        except OSError as exc:
            out, err, code = "", f"could not run the plan: {exc}", 1
        text = out if code == 0 else (err.strip() or f"the plan exited with status {code}")
        self.app.call_from_thread(self._show, text, code == 0)

    def _show(self, text: str, ok: bool) -> None:
        self.result = text
        body = Text("\n".join(clean(line) for line in text.splitlines()), style="" if ok else "yellow")
        self.query_one("#plan-like-text", Static).update(body)

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def action_close(self) -> None:
        self._kill()
        self.dismiss(None)


__all__ = ["PlanLikeScreen", "plan_command"]
