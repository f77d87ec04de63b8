"""The start-up frame: drawn from the first NVML read before Textual is loaded; the monitor's fields at
the monitor's places, and no colour or non-ASCII where the terminal cannot take them."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import frozen

from tui import first_frame
from tui.terminal import Display
from tui.view.gpus import short_name

REPO = Path(__file__).resolve().parents[2]
_COLOUR = re.compile(r"\x1b\[[0-9;]*(?:3[0-7]|9[0-7]|4[0-7]|10[0-7]|38;5;\d+|48;5;\d+)(?:;[0-9;]*)?m")


def _text(frame: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", frame)


def test_frame_holds_the_header_gpus_and_processes_side_by_side() -> None:
    machine = frozen.machine()
    frame = first_frame.render(machine, Display(), 160, 45, 2.0)
    assert frame.startswith(first_frame.ENTER)
    text = _text(frame)
    assert machine.nvml.driver_version in text and "Pwr:Usage/Cap" in text and "Bus-Id" in text
    for gpu in machine.gpus:
        assert gpu.bus_id in text
    for process in machine.processes:
        assert str(process.pid) in text
    assert _COLOUR.search(frame)  # colour where the terminal has it
    placed = first_frame.layout_lines(machine, Display(), 160, 45, 2.0)
    assert placed[0][1].plain.startswith("anatomy-top") and "Bus-Id" in placed[2][1].plain  # as the app
    assert short_name(machine.gpus[0].name) in placed[4][1].plain


def test_narrow_frame_is_compact_and_leaves_the_tab_line() -> None:
    placed = first_frame.layout_lines(frozen.machine(), Display(), 80, 24, 2.0)
    assert 2 not in placed  # the pane tabs' line
    assert placed[3][1].plain.split()[:3] == ["GPU", "Name", "Memory-Usage"]
    assert max(placed) < 23  # the key bar's line is left alone


def test_plain_and_ascii_frames() -> None:
    machine = frozen.machine()
    plain = first_frame.render(machine, Display(color=False), 120, 40, 2.0)
    assert not _COLOUR.search(plain) and not re.search(r"\x1b\[[0-9;]*m", plain)  # no SGR at all
    ascii_only = first_frame.render(machine, Display(unicode=False), 120, 40, 2.0)
    assert ascii_only.isascii() and "#" in _text(ascii_only)


def test_paint_only_on_a_terminal_and_leave_gives_it_back() -> None:
    out = io.StringIO()
    assert first_frame.paint(frozen.machine(), Display(), 2.0, stream=out) is False  # not a tty
    assert out.getvalue() == ""
    first_frame.leave(out)
    assert out.getvalue() == first_frame.LEAVE


def test_the_frame_loads_no_textual() -> None:
    code = (
        "import sys; sys.path.insert(0, 'tests/tui'); import frozen\n"
        "from tui import first_frame; from tui.terminal import Display\n"
        "first_frame.render(frozen.machine(), Display(), 160, 45, 2.0)\n"
        "print(' '.join(m for m in ('textual', 'rich.console', 'psutil') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == []
