"""One sanitiser for every untrusted string that reaches a screen, a report line or a label.

Strings come from other processes: a hook's published fields (model class, optimizer, suggestion text,
error), a process's name and command line. A control character in them is an instruction to the
terminal (ESC starts a sequence that can clear the screen, set the window title or move the cursor;
BEL rings; CR/LF split a report line), and a bidirectional override makes text read differently from
what it is. Every view passes such strings through :func:`clean`, which replaces each of those
characters with its visible escape (``\\x1b``, ``\\n``, ``\\u202e``), so a hostile name is shown, not
obeyed, and an honest one is unchanged. Markup characters (``[``, ``]``) are left alone: the TUI wraps
text in ``rich.text.Text``, which never parses markup.

Stdlib only.
"""

from __future__ import annotations

import unicodedata

# Joiners are format characters too, but emoji sequences and several scripts need them to render.
_KEEP_FORMAT = frozenset("\u200c\u200d")


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by surrogateescape: show the byte
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def clean(text: str) -> str:
    """``text`` with every character a terminal would act on (C0/C1 controls, DEL, ESC, BEL, CR/LF/TAB,
    bidi overrides and isolates, other format characters, line/paragraph separators, lone surrogates)
    replaced by its visible escape; other non-ASCII spaces become a plain space."""
    if text.isprintable():  # the common case, at C speed
        return text
    out: list[str] = []
    for ch in text:
        if ch.isprintable() or ch in _KEEP_FORMAT:
            out.append(ch)
        elif unicodedata.category(ch) == "Zs":
            out.append(" ")
        else:
            out.append(_escape(ch))
    return "".join(out)


def clean_or_none(text: str | None) -> str | None:
    return None if text is None else clean(text)
