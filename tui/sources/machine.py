"""One ``MachineSnapshot`` per refresh (NVML + host + processes), built one way for every caller.

``machine_snapshot`` is the one builder: an NVML reading, its processes enriched by the host, the host
line. The live monitor's ``MachineSource`` (its enricher keeps state between refreshes: CPU % over the
interval, cached command lines) and the one-shot readers (``--once`` and the monitor's start-up frame:
``one_shot_host``, /proc without psutil on Linux) hand it their host side; the snapshot is assembled,
and enrichment failures handled, the same way.

Blocking (NVML and /proc reads): call it from a worker thread in the TUI. Thread-safe, never raises.
Imports only the data model at load time: ``--once`` loads this module and must not pay for psutil.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tui.sources.model import GpuProcess, HostInfo, MachineSnapshot

# typing is not imported at run time (~3 ms of --once start-up); the names are for type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from tui.sources.host import HostSource
    from tui.sources.nvml import NvmlReading, NvmlSource
    from tui.sources.processes import ProcessEnricher

Enrich = Callable[[tuple[GpuProcess, ...]], tuple[GpuProcess, ...]]
HostLine = Callable[[], HostInfo]


def machine_snapshot(now: float, reading: NvmlReading, enrich: Enrich, host: HostLine) -> MachineSnapshot:
    """The snapshot of one NVML ``reading`` taken at ``now``: its processes as the host sees them
    (``enrich``), and the host line (``host``). Enrichment is a bonus: where it fails NVML's own facts
    still stand; where the host line fails it is N/A."""
    try:
        processes = enrich(reading.processes)
    except Exception:
        processes = reading.processes
    try:
        info = host()
    except Exception:
        info = HostInfo()
    return MachineSnapshot(time=now, nvml=reading.status, gpus=reading.gpus, processes=processes, host=info)


def one_shot_host() -> tuple[Enrich, HostLine]:
    """The host side of a single snapshot: /proc on Linux (no psutil import), psutil elsewhere."""
    from tui.sources import procfs

    if procfs.available():
        return procfs.enrich, procfs.host
    from tui.sources.host import HostSource
    from tui.sources.processes import ProcessEnricher

    return ProcessEnricher().enrich, HostSource().snapshot


def read_once(source: NvmlSource, close: bool = False) -> tuple[MachineSnapshot, int]:
    """One machine snapshot, and the NVML calls it took: one NVML pass (then NVML is shut down when
    ``close``), then the host's view of its processes (``one_shot_host``)."""
    now = time.time()
    try:
        reading = source.query()
    finally:
        if close:
            source.close()
    enrich, host = one_shot_host()
    return machine_snapshot(now, reading, enrich, host), reading.calls


class MachineSource:
    """``snapshot()`` → MachineSnapshot; ``close()`` shuts NVML down after any in-flight snapshot.

    ``last_nvml_calls`` is the number of NVML calls the latest snapshot made (its cost), and
    ``total_nvml_calls`` the sum since creation.
    """

    def __init__(
        self,
        *,
        nvml: NvmlSource | None = None,
        host: HostSource | None = None,
        enricher: ProcessEnricher | None = None,
        slow_ttl: float = 5.0,
        fast_ttl: float = 0.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        from tui.sources.host import HostSource
        from tui.sources.nvml import NvmlSource
        from tui.sources.processes import ProcessEnricher

        self.nvml = nvml if nvml is not None else NvmlSource(slow_ttl=slow_ttl, fast_ttl=fast_ttl)
        self.host = host if host is not None else HostSource()
        self.enricher = enricher if enricher is not None else ProcessEnricher()
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self.last_nvml_calls = 0

    @property
    def total_nvml_calls(self) -> int:
        return self.nvml.total_calls

    def snapshot(self) -> MachineSnapshot:
        with self._lock:
            now = self._wall_clock()
            reading = self.nvml.query()
            self.last_nvml_calls = reading.calls
            return machine_snapshot(now, reading, self.enricher.enrich, self.host.snapshot)

    def close(self) -> None:
        self.nvml.close()

    def __enter__(self) -> MachineSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
