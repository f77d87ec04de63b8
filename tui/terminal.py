"""What the user's terminal can show: colour or not, Unicode or ASCII only.

- colour is off when ``NO_COLOR`` is set to anything non-empty (https://no-color.org) or ``TERM=dumb``;
- ASCII only with ``--ascii``, or when the locale the user asked for is not UTF-8 (``LC_ALL``, else
  ``LC_CTYPE``, else ``LANG``; unset means C).

Python coerces a C/POSIX locale to C.UTF-8 for itself (PEP 538: it sets ``LC_CTYPE=C.UTF-8`` in its own
environment) and then runs in UTF-8 mode; that ``LC_CTYPE`` says nothing about the terminal, so it is
ignored when UTF-8 mode was switched on by the locale rather than by the user.

``to_ascii`` is the one transliteration every view goes through in ASCII mode (the monitor through a
Textual line filter, the start-up frame directly): each character becomes ASCII of the same width, so
columns stay aligned. Stdlib only.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

_COERCED_CTYPES = frozenset({"C.UTF-8", "C.utf8", "C.UTF8", "C.utf-8"})


@dataclass(frozen=True)
class Display:
    """How to draw: ``color`` False means no colour escape at all; ``unicode`` False means ASCII only."""

    color: bool = True
    unicode: bool = True
    why: str = ""  # what switched a capability off, in words (for --help's users and the tests)

    @property
    def plain(self) -> bool:
        return not self.color

    @property
    def ascii(self) -> bool:
        return not self.unicode


def user_locale(environ: Mapping[str, str], utf8_mode: bool | None = None) -> str:
    """The character-type locale the user asked for ('' when none: the C locale)."""
    utf8_mode = bool(sys.flags.utf8_mode) if utf8_mode is None else utf8_mode
    coerced = utf8_mode and "PYTHONUTF8" not in environ and environ.get("LC_CTYPE") in _COERCED_CTYPES
    for name in ("LC_ALL", "LC_CTYPE", "LANG"):
        value = environ.get(name, "")
        if not value or (name == "LC_CTYPE" and coerced):
            continue
        return value
    return ""


def locale_is_utf8(environ: Mapping[str, str], utf8_mode: bool | None = None) -> bool:
    name = user_locale(environ, utf8_mode).upper().replace("-", "")
    return "UTF8" in name


def detect(
    environ: Mapping[str, str] | None = None, *, ascii_only: bool = False, utf8_mode: bool | None = None
) -> Display:
    env = os.environ if environ is None else environ
    reasons: list[str] = []
    color = True
    if env.get("NO_COLOR", ""):
        color = False
        reasons.append("NO_COLOR is set")
    if env.get("TERM", "").lower() == "dumb":
        color = False
        reasons.append("TERM=dumb")
    unicode = True
    if ascii_only:
        unicode = False
        reasons.append("--ascii")
    elif not locale_is_utf8(env, utf8_mode):
        unicode = False
        reasons.append(f"the locale ({user_locale(env, utf8_mode) or 'C'}) is not UTF-8")
    return Display(color=color, unicode=unicode, why="; ".join(reasons))


# Characters the monitor draws, and the ASCII that reads the same in their place (one cell each).
_ASCII: dict[str, str] = {
    "·": ".",
    "•": "*",
    "—": "-",
    "–": "-",
    "−": "-",
    "…": "~",
    "✓": "*",
    "✗": "x",
    "×": "x",
    "µ": "u",
    "°": "o",
    "◆": "*",
    "◇": "o",
    "●": "*",
    "○": "o",
    "▲": "^",
    "▼": "v",
    "▶": ">",
    "◀": "<",
    "►": ">",
    "◄": "<",
    "←": "<",
    "→": ">",
    "↑": "^",
    "↓": "v",
    "≈": "~",
    "≤": "<",
    "≥": ">",
    "‘": "'",
    "’": "'",
    "“": '"',
    "”": '"',
    # Meters: a full cell, the track, and the eighths of a partly filled cell (rounded to a half).
    "█": "#",
    "▉": "#",
    "▊": "#",
    "▋": "#",
    "▌": "#",
    "▍": ".",
    "▎": ".",
    "▏": ".",
    "░": ".",
    "▒": ":",
    "▓": "%",
    # Sparklines: eight heights.
    "▁": "_",
    "▂": "_",
    "▃": ".",
    "▄": "-",
    "▅": "-",
    "▆": "=",
    "▇": "=",
    "▀": "-",
    "▐": "|",
    "▔": "-",
    "▕": "|",
}


@lru_cache(maxsize=4096)
def _ascii_char(ch: str) -> str:
    mapped = _ASCII.get(ch)
    if mapped is not None:
        return mapped
    code = ord(ch)
    if 0x2500 <= code <= 0x257F:  # box drawing
        name = unicodedata.name(ch, "")
        if "HORIZONTAL" in name and "VERTICAL" not in name:
            return "-"
        if "VERTICAL" in name and "HORIZONTAL" not in name:
            return "|"
        return "+"
    if unicodedata.category(ch) == "Zs":
        return " "
    if unicodedata.combining(ch):
        return ""
    decomposed = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    if len(decomposed) == 1:  # é -> e
        return decomposed
    return "??" if unicodedata.east_asian_width(ch) in ("W", "F") else "?"


def to_ascii(text: str) -> str:
    """``text`` with every character outside ASCII replaced by ASCII of the same width."""
    if text.isascii():
        return text
    return "".join(ch if ch.isascii() else _ascii_char(ch) for ch in text)
