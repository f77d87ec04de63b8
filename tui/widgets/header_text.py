"""The top lines' text: driver and CUDA versions, host CPU and memory (a ``HeaderView``, its figures
already in words), refresh state; the NVML banner. Pure functions (rich.text only): the start-up frame
draws them before Textual is loaded."""

from __future__ import annotations

from rich.text import Text

from tui.sources.model import MachineSnapshot
from tui.view.header import HeaderView

COMPACT_BELOW = 100  # columns: below this the header drops swap and load to stay two lines


def header_text(header: HeaderView | None, interval: float, paused: bool, compact: bool = False) -> Text:
    """The header's lines: ``header`` (None before the first sample) and the refresh state."""
    text = Text()
    text.append("anatomy-top", style="bold cyan")
    if header is None:
        text.append("  waiting for the first sample…", style="bright_black")
        return text
    if header.hostname:
        text.append("  ")
        text.append(Text(header.hostname, style="bold"))
    text.append("  Drv " if compact else "  Driver ", style="bright_black")
    text.append(header.driver)
    text.append("  CUDA ", style="bright_black")
    text.append(header.cuda)
    clock = header.clock
    if not compact:
        text.append(f"  {clock}  every {interval:g} s", style="bright_black")
        if paused:
            text.append("  PAUSED", style="bold reverse yellow")
    text.append("\n")
    cores = f" of {header.cpu_count}" if header.cpu_count and not compact else ""
    text.append("CPU ", style="bright_black")
    text.append(f"{header.cpu}{cores}")
    text.append("  Mem ", style="bright_black")
    text.append(header.memory)
    if compact:
        text.append(f"  {clock}  {interval:g} s", style="bright_black")
        if paused:
            text.append("  PAUSED", style="bold reverse yellow")
        return text
    if header.swap is not None:
        text.append("  Swap ", style="bright_black")
        text.append(header.swap)
    if header.load is not None:
        text.append("  load ", style="bright_black")
        text.append(header.load)
    return text


def banner_text(machine: MachineSnapshot | None) -> Text | None:
    """One line when NVML is unavailable, saying why (the reason is shown verbatim, never as markup)."""
    if machine is None or machine.nvml.available:
        return None
    text = Text("No GPU shown: ", style="bold yellow")
    text.append(Text(machine.nvml.reason or "NVML is unavailable"))
    text.append(" — training processes that publish are listed with their host figures.", style="yellow")
    return text
