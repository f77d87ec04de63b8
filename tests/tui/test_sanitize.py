"""tui.sanitize.clean: hostile strings are shown, not obeyed; honest ones are unchanged."""

from __future__ import annotations

import pytest

from tui.sanitize import clean, clean_or_none


@pytest.mark.parametrize(
    "text",
    ["python train.py --lr 3e-4 [rank0]", "[/] [bold]x[/bold]", "ｔｒａｉｎ.py 训练 模型", "👩‍💻 job", ""],
)
def test_honest_strings_are_unchanged(text: str) -> None:
    assert clean(text) == text


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b[2Jb", "a\\x1b[2Jb"),  # clear screen
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),  # set the window title, BEL-terminated
        ("\x9b2J", "\\x9b2J"),  # C1 CSI
        ("line1\nline2\r\tend", "line1\\nline2\\r\\tend"),
        ("abc\u202edcba", "abc\\u202edcba"),  # right-to-left override
        ("\u2066x\u2069", "\\u2066x\\u2069"),  # isolates
        ("del\x7f", "del\\x7f"),
        ("a\u2028b", "a\\u2028b"),  # line separator
        ("bad\udcffbyte", "bad\\xffbyte"),  # surrogateescape'd byte from /proc
        ("no\u00a0break", "no break"),
    ],
)
def test_controls_become_visible_escapes(text: str, shown: str) -> None:
    out = clean(text)
    assert out == shown
    assert all(ch.isprintable() or ch in "\u200c\u200d" for ch in out)


def test_none_passes_through() -> None:
    assert clean_or_none(None) is None
    assert clean_or_none("\x1b") == "\\x1b"
