"""The collector behind /metrics: every scrape reads NVML and every hook socket of the node, then builds its
metric families from what it just read.

Nothing is kept from one scrape to the next but the connections and what never changes: one
``AnatomySource`` per trusted runtime directory (its readers stay connected, so a scrape drains what each
hook pushed and takes the latest snapshot, as the monitor does), one ``NvmlSource`` (device handles and
the identity fields: name, UUID, bus id; slow fields — temperature, fan, power limit, ECC — at most every
``SLOW_TTL_S``; memory, utilization, power and processes at every scrape; nvidia-smi's other fields,
which are not exported, never), and each GPU process's command while NVML lists it. Each process is
numbered by the kernel's PID for its socket's server (SO_PEERCRED), so a hook in a container is joined
with NVML's node PID. A process that exits drops out of the next scrape: its series end. Scrapes are
serialised (NVML and the sources are read by one thread at a time), and a failure of either side is a
value — the other side still shows.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.core import Metric

from tui.exporter import discovery
from tui.exporter.families import Rank, Scrape, families, gpu_of
from tui.exporter.gpu_processes import MAX_PROCESSES, NodeProcesses
from tui.exporter.identity import assign_keys, label_value, parent_pid
from tui.exporter.read_ahead import ReadAhead
from tui.sources.anatomy_source import ERROR, LIVE, AnatomySource, TrainingProcess
from tui.sources.model import NvmlStatus
from tui.sources.nvml import VIEW_ONLY_FIELDS, NvmlReading, NvmlSource

# How long one scrape waits, in all, for hooks that just connected to send their hello and snapshot.
FIRST_WAIT_S = 0.05


class NodeCollector:
    """A prometheus_client collector (``collect()``) for one node. ``close()`` ends NVML and the readers."""

    # Slow fields (temperature, fan, power limit, ECC, MIG mode) are read at most this often; fast ones
    # (memory, utilization, power, processes) at every scrape. dcgm-exporter collects every 30 s.
    SLOW_TTL_S = 30.0

    def __init__(
        self,
        *,
        dirs: Sequence[Path] = (),
        hostname: str | None = None,
        nvml: NvmlSource | None = None,
        euid: int | None = None,
        first_wait_s: float = FIRST_WAIT_S,
        warn: Callable[[str], None] | None = None,
        ppid: Callable[[int], int | None] = parent_pid,
        max_processes: int = MAX_PROCESSES,
        clock: Callable[[], float] = time.monotonic,
        read_ahead: bool = True,
    ) -> None:
        """``clock``: the monotonic time NVML's slow tier is aged by (tests move it). ``read_ahead``:
        read NVML just before each scrape when scrapes come at a steady interval (``read_ahead``)."""
        self._dirs = list(dirs)
        self._hostname = hostname
        # Only what is exported is asked for, the GPUs side by side (a scrape waits for one GPU's calls).
        self._nvml = (
            nvml
            if nvml is not None
            else NvmlSource(
                slow_ttl=self.SLOW_TTL_S,
                fast_ttl=0.0,
                omit=(*VIEW_ONLY_FIELDS, "nvml_version"),
                parallel=True,
                clock=clock,
            )
        )
        self._node_processes = NodeProcesses(max_processes)
        self._poller = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hooks")
        # When Prometheus scrapes at a steady interval, NVML is read just before each scrape.
        self._ahead = ReadAhead(self._nvml.query) if read_ahead else None
        self._euid = euid
        self._first_wait_s = first_wait_s
        self._warn = warn
        self._ppid = ppid
        self._sources: dict[Path, tuple[AnatomySource, int]] = {}
        self._warned: set[tuple[Path, str]] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.last: Scrape | None = None

    # prometheus_client: an empty describe() means "do not collect at registration".
    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from families(self.scrape())

    def scrape(self, wait_s: float | None = None) -> Scrape:
        """Read NVML and every hook now. ``wait_s``: how long to wait for new hooks' first snapshot."""
        with self._lock:
            start = time.perf_counter()
            hostname = self._hostname or label_value(socket.gethostname())
            nvml_age = 0.0
            if self._closed:
                reading = NvmlReading(NvmlStatus(available=False, reason="exporter closed"))
                processes: list[tuple[TrainingProcess, int]] = []
                rejected = failed = 0
            else:
                # The hooks are read on a helper thread while NVML is: NVML's calls wait in the driver
                # (the GIL released), the hooks' reads are Python; a scrape takes the longer, not the sum.
                began = time.monotonic()
                ahead = self._ahead.take() if self._ahead is not None else None
                polled = self._poller.submit(self._poll, self._first_wait_s if wait_s is None else wait_s)
                reading, nvml_age = ahead if ahead is not None else (self._nvml.query(), 0.0)
                processes, rejected, failed = polled.result()
                if self._ahead is not None:
                    self._ahead.scraped(began)
            counts: dict[str, int] = {ERROR: failed} if failed else {}
            for proc, _ in processes:
                counts[proc.state] = counts.get(proc.state, 0) + 1
            live = [p for p, _ in processes if p.state == LIVE and p.hello is not None]
            # AnatomySource numbers each process as the kernel does in our namespace (SO_PEERCRED).
            node_pids = [p.pid for p in live]
            keys = assign_keys([p.hello for p in live if p.hello is not None], self._ppid, node_pids)
            ranks = []
            node_processes, dropped = self._node_processes.read(reading.processes)
            for key, proc, node_pid in zip(keys, live, node_pids, strict=True):
                gpu, nvml_bytes = gpu_of(node_pid, reading.gpus, reading.processes)
                ranks.append(Rank(key, proc, gpu=gpu, nvml_bytes=nvml_bytes, node_pid=node_pid))
            scrape = Scrape(
                hostname=hostname,
                nvml=reading.status,
                gpus=reading.gpus,
                gpu_processes=reading.processes,
                ranks=sorted(ranks, key=lambda r: (r.key.run_id, _rank_order(r.key.rank))),
                publishers=counts,
                nvml_calls=reading.calls,
                nvml_age_s=nvml_age,
                duration_s=time.perf_counter() - start,
                rejected_dirs=rejected,
                processes=node_processes,
                processes_dropped=dropped,
            )
            self.last = scrape
            return scrape

    def _poll(self, wait_s: float) -> tuple[list[tuple[TrainingProcess, int]], int, int]:
        trusted, rejected = discovery.runtime_dirs(self._dirs, self._euid)
        for r in rejected:
            if (r.path, r.reason) not in self._warned and self._warn is not None:
                self._warned.add((r.path, r.reason))
                self._warn(f"not reading {r.path}: it {r.reason}")
        wanted = {d.path: d.owner for d in trusted}
        for path in [p for p in self._sources if wanted.get(p) != self._sources[p][1]]:
            self._sources.pop(path)[0].close()
        out: list[tuple[TrainingProcess, int]] = []
        failed = 0
        for path, owner in wanted.items():
            if path not in self._sources:
                # exited_ttl_s 0: a process that exits leaves the next scrape.
                self._sources[path] = (AnatomySource(path, exited_ttl_s=0.0, owner=owner), owner)
            source = self._sources[path][0]
            reading = source.read(wait_for_first_s=wait_s)
            # The source's own failure is no process: counted among the publishers in state "error".
            failed += len(reading.errors)
            for proc in reading.processes:
                if discovery.socket_owned_by(proc.path, owner):
                    out.append((proc, owner))
        return out, len(rejected), failed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._ahead is not None:
                self._ahead.close()
            for source, _ in self._sources.values():
                source.close()
            self._sources.clear()
            self._nvml.close()
            self._poller.shutdown(wait=False)


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.lstrip("-").isdigit() else (1 << 30, rank)
