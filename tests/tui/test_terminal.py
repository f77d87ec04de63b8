"""What the terminal can show (tui.terminal): NO_COLOR, TERM=dumb, --ascii and the locale; the ASCII
transliteration keeps every column in place."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from rich.text import Text

from tui.terminal import detect, locale_is_utf8, to_ascii


@pytest.mark.parametrize(
    ("env", "utf8_mode", "color", "unicode"),
    [
        ({"TERM": "xterm-256color", "LANG": "en_US.UTF-8"}, False, True, True),
        ({"TERM": "xterm-256color", "LANG": "C.UTF-8", "NO_COLOR": "1"}, False, False, True),
        ({"TERM": "xterm", "LANG": "C.UTF-8", "NO_COLOR": ""}, False, True, True),  # empty: not set
        ({"TERM": "dumb", "LANG": "C.UTF-8"}, False, False, True),
        ({"TERM": "xterm", "LANG": "C"}, False, True, False),
        ({"TERM": "xterm", "LC_ALL": "POSIX", "LANG": "en_US.UTF-8"}, False, True, False),
        ({"TERM": "xterm", "LC_ALL": "de_DE.utf8"}, False, True, True),
        ({"TERM": "xterm"}, False, True, False),  # no locale at all: C
        # Python coerced a C locale (PEP 538): its LC_CTYPE=C.UTF-8 is not the user's
        ({"TERM": "xterm", "LANG": "C", "LC_CTYPE": "C.UTF-8"}, True, True, False),
        # ... but a UTF-8 LANG that is merely not installed here still means a UTF-8 terminal
        ({"TERM": "xterm", "LANG": "en_US.UTF-8", "LC_CTYPE": "C.UTF-8"}, True, True, True),
        # a user who set LC_CTYPE=C.UTF-8 (no coercion: UTF-8 mode off)
        ({"TERM": "xterm", "LANG": "C", "LC_CTYPE": "C.UTF-8"}, False, True, True),
    ],
)
def test_detect(env: dict[str, str], utf8_mode: bool, color: bool, unicode: bool) -> None:
    caps = detect(env, utf8_mode=utf8_mode)
    assert (caps.color, caps.unicode) == (color, unicode), caps.why
    assert caps.plain is not color and caps.ascii is not unicode
    assert (caps.why == "") is (color and unicode)


def test_ascii_flag_wins_over_a_utf8_locale() -> None:
    caps = detect({"TERM": "xterm", "LANG": "C.UTF-8"}, ascii_only=True, utf8_mode=False)
    assert caps.ascii and caps.color and "--ascii" in caps.why


@pytest.mark.parametrize("lang", ["C", "POSIX", "en_US.UTF-8"])
def test_the_locale_python_really_starts_with(lang: str) -> None:
    """Through a real interpreter: its own coercion of C/POSIX must not read as a UTF-8 terminal."""
    code = "import os, sys; from tui.terminal import locale_is_utf8; print(locale_is_utf8(os.environ))"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONUTF8"))}
    env["LANG"] = lang
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(lang.endswith("UTF-8"))
    assert locale_is_utf8({"LANG": lang}, utf8_mode=False) is lang.endswith("UTF-8")


def test_to_ascii_keeps_every_cell() -> None:
    samples = [
        "◆ 4242 · sort ◆ first, GPU MEM ▼ ✓ — 850 µs ×1.2",
        "█▉▊▋▌▍▎▏░ ▁▂▃▄▅▆▇█",
        "╭──┬──╮│┃║╰──╯┼",
        "naïve café 模型 🚀",
    ]
    for sample in samples:
        out = to_ascii(sample)
        assert out.isascii()
        assert Text(out).cell_len == Text(sample).cell_len, (sample, out)
    assert to_ascii("◆ PID 7 · ▲") == "* PID 7 . ^"
    assert to_ascii("█████▌░░") == "######.."
    assert to_ascii("plain ascii") == "plain ascii"
