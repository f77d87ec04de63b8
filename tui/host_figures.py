"""Host figures (user, command, CPU %, RSS, running time) for the publishing processes NVML does not list:
CPU training, or no NVIDIA driver."""

from __future__ import annotations

from collections.abc import Sequence

from tui.sources.model import GpuProcess


class HostFigures:
    """Host figures (user, command, CPU %, RSS, running time) for publishing processes NVML does not
    list: CPU training, or no NVIDIA driver. Called in the poll worker, never on the UI thread."""

    def __init__(self) -> None:
        from tui.sources.processes import ProcessEnricher

        self._enricher = ProcessEnricher()

    def __call__(self, pids: Sequence[int]) -> dict[int, GpuProcess]:
        bare = [GpuProcess(gpu_index=-1, pid=pid, type="-") for pid in pids]
        return {p.pid: p for p in self._enricher.enrich(bare)}


__all__ = ["HostFigures"]
