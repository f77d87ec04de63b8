"""A private tmux server per test (its own socket), for end-to-end tests in a real terminal."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable


class Tmux:
    """One private tmux server (its own socket) holding one session of ``width`` x ``height``."""

    def __init__(self, name: str, width: int = 160, height: int = 50) -> None:
        self.socket = f"anatomy-e2e-{os.getpid()}-{name}"
        self.session = name
        self.width, self.height = width, height

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["tmux", "-L", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            check=check,
            timeout=10,
        )

    def start(self, command: str) -> None:
        self._run(
            "new-session", "-d", "-s", self.session, "-x", str(self.width), "-y", str(self.height), command
        )

    def capture(self, escapes: bool = False) -> str:
        """The pane's text; with ``escapes``, with its colours and attributes as escape sequences."""
        flags = ["-e"] if escapes else []
        done = self._run("capture-pane", "-p", *flags, "-t", self.session, check=False)
        return done.stdout if done.returncode == 0 else ""

    def display(self, fmt: str) -> str:
        """A tmux format expanded for the pane (``#{alternate_on}``...); "" when the server is gone."""
        done = self._run("display-message", "-p", "-t", self.session, fmt, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    def alive(self) -> bool:
        return self._run("has-session", "-t", self.session, check=False).returncode == 0

    def keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", self.session, *keys)

    def kill(self) -> None:
        self._run("kill-server", check=False)


def wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()
