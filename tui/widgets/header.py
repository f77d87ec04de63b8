"""The top lines: driver and CUDA versions, host CPU and memory, refresh state, and the NVML banner."""

from __future__ import annotations

import time
from typing import Any

from rich.segment import Segment
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

from tui import format as fmt
from tui.sources.model import MachineSnapshot
from tui.widgets.line_table import same_text
from tui.widgets.text_static import TextStatic

COMPACT_BELOW = 100  # columns: below this the header drops swap and load to stay two lines


def header_text(
    machine: MachineSnapshot | None, interval: float, paused: bool, compact: bool = False
) -> Text:
    text = Text()
    text.append("anatomy-top", style="bold cyan")
    if machine is None:
        text.append("  waiting for the first sample…", style="bright_black")
        return text
    host = machine.host
    if host.hostname:
        text.append("  ")
        text.append(Text(host.hostname, style="bold"))
    nvml = machine.nvml
    text.append("  Drv " if compact else "  Driver ", style="bright_black")
    text.append(nvml.driver_version or fmt.NA)
    text.append("  CUDA ", style="bright_black")
    text.append(nvml.cuda_driver_version or fmt.NA)
    clock = time.strftime("%H:%M:%S", time.localtime(machine.time))
    if not compact:
        text.append(f"  {clock}  every {interval:g} s", style="bright_black")
        if paused:
            text.append("  PAUSED", style="bold reverse yellow")
    text.append("\n")
    cpu = fmt.fmt_percent(host.cpu_percent)
    cores = f" of {host.cpu_count}" if host.cpu_count and not compact else ""
    text.append("CPU ", style="bright_black")
    text.append(f"{cpu}{cores}")
    text.append("  Mem ", style="bright_black")
    text.append(fmt.fmt_bytes_pair(host.memory_used, host.memory_total))
    if compact:
        text.append(f"  {clock}  {interval:g} s", style="bright_black")
        if paused:
            text.append("  PAUSED", style="bold reverse yellow")
        return text
    if host.swap_total:
        text.append("  Swap ", style="bright_black")
        text.append(fmt.fmt_bytes_pair(host.swap_used, host.swap_total))
    if host.load_avg is not None:
        text.append("  load ", style="bright_black")
        text.append(" ".join(f"{x:.2f}" for x in host.load_avg))
    return text


def banner_text(machine: MachineSnapshot | None) -> Text | None:
    """One line when NVML is unavailable, saying why (the reason is shown verbatim, never as markup)."""
    if machine is None or machine.nvml.available:
        return None
    text = Text("No GPU shown: ", style="bold yellow")
    text.append(Text(machine.nvml.reason or "NVML is unavailable"))
    text.append(" — training processes that publish are listed with their host figures.", style="yellow")
    return text


class TextLines(Widget):
    """Rich text drawn through the line API, one strip per line, never wrapped (too long a line is
    cropped). A new text repaints only its changed lines, and re-lays out only when the number of lines
    changed: the header changes on every refresh (clock, CPU %), and a ``Static`` re-renders all of it
    through Textual's content pipeline, which was a fifth of a refresh's main-thread time."""

    DEFAULT_CSS = """
    TextLines { height: auto; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._text = Text()
        self._lines: list[Text] = [Text()]
        self._strips: dict[int, Strip] = {}

    @property
    def text(self) -> Text:
        return self._text

    def show_text(self, text: Text) -> None:
        if same_text(text, self._text):
            return
        lines = list(text.split("\n", allow_blank=True)) or [Text()]
        old = self._lines
        self._text, self._lines = text, lines
        if len(lines) != len(old):
            self._strips.clear()
            self.refresh(layout=True)
            return
        for y, (before, after) in enumerate(zip(old, lines, strict=True)):
            if not same_text(before, after):
                self._strips.pop(y, None)
                self.refresh(Region(0, y, self.size.width, 1))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._lines)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y >= len(self._lines):
            return Strip.blank(width, base)
        strip = self._strips.get(y)
        if strip is None:
            segments = list(self._lines[y].render(self.app.console, end=""))
            strip = Strip(Segment.apply_style(segments, base))
            self._strips[y] = strip
        return strip.crop_extend(0, width, base)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    def on_resize(self) -> None:
        self._strips.clear()


class MachineHeader(TextLines):
    DEFAULT_CSS = """
    MachineHeader { height: auto; padding: 0 1; }
    """

    _args: tuple[MachineSnapshot | None, float, bool] = (None, 1.0, False)

    def show(self, machine: MachineSnapshot | None, interval: float, paused: bool) -> None:
        self._args = (machine, interval, paused)
        width = self.size.width or self.app.size.width
        self.show_text(header_text(machine, interval, paused, compact=width < COMPACT_BELOW))

    def on_resize(self) -> None:
        super().on_resize()
        self.show(*self._args)


class NvmlBanner(TextStatic):
    DEFAULT_CSS = """
    NvmlBanner { height: auto; padding: 0 1; display: none; }
    NvmlBanner.-visible { display: block; }
    """

    def show(self, machine: MachineSnapshot | None) -> None:
        text = banner_text(machine)
        self.set_class(text is not None, "-visible")
        self.show_text(text if text is not None else "")
