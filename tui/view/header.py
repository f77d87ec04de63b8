"""What the header's lines show of one machine snapshot (``HeaderView``): each figure already in words.
The header widget (and the start-up frame) only lay them out, with the refresh state beside them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tui import format as fmt
from tui.sources.model import MachineSnapshot


@dataclass(frozen=True)
class HeaderView:
    hostname: str | None
    driver: str
    cuda: str
    clock: str  # the snapshot's local time, HH:MM:SS
    cpu: str  # host CPU %
    cpu_count: int | None
    memory: str  # "used / total"
    swap: str | None  # "used / total"; None: the host has no swap
    load: str | None  # the 1, 5 and 15 minute load averages; None: unknown


def header_view(machine: MachineSnapshot | None) -> HeaderView | None:
    """None before the first sample."""
    if machine is None:
        return None
    host, nvml = machine.host, machine.nvml
    return HeaderView(
        hostname=host.hostname or None,
        driver=nvml.driver_version or fmt.NA,
        cuda=nvml.cuda_driver_version or fmt.NA,
        clock=time.strftime("%H:%M:%S", time.localtime(machine.time)),
        cpu=fmt.fmt_percent(host.cpu_percent),
        cpu_count=host.cpu_count,
        memory=fmt.fmt_bytes_pair(host.memory_used, host.memory_total),
        swap=fmt.fmt_bytes_pair(host.swap_used, host.swap_total) if host.swap_total else None,
        load=" ".join(f"{x:.2f}" for x in host.load_avg) if host.load_avg is not None else None,
    )
