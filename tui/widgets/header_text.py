"""The top lines' text: driver and CUDA versions, host CPU and memory, refresh state; the NVML banner.
Pure functions (rich.text only): the start-up frame draws them before Textual is loaded."""

from __future__ import annotations

import time

from rich.text import Text

from tui import format as fmt
from tui.sources.model import MachineSnapshot

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
