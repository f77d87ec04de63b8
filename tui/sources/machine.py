"""The facade the TUI and ``--once`` call: one ``MachineSnapshot`` per refresh (NVML + host + processes).

Blocking (NVML and /proc reads): call it from a worker thread in the TUI. Thread-safe, never raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tui.sources.host import HostSource
from tui.sources.model import HostInfo, MachineSnapshot
from tui.sources.nvml import NvmlSource
from tui.sources.processes import ProcessEnricher


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
            try:
                processes = self.enricher.enrich(reading.processes)
            except Exception:  # enrichment is a bonus: NVML's own facts still stand
                processes = reading.processes
            try:
                host = self.host.snapshot()
            except Exception:
                host = HostInfo()
            return MachineSnapshot(
                time=now, nvml=reading.status, gpus=reading.gpus, processes=processes, host=host
            )

    def close(self) -> None:
        self.nvml.close()

    def __enter__(self) -> MachineSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
