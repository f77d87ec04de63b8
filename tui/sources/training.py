"""What the anatomy source reports: one ``TrainingProcess`` per publishing training process, and the
source's own failures beside them (``TrainingReading``), never as processes.

Stdlib only (plus anatomy.protocol's messages): the monitor never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from anatomy.protocol import Hello, Snapshot
from anatomy.vocabulary import PublisherState
from tui.sources.model import SourceError

# The vocabulary's words, under the names the monitor's modules import.
LIVE = PublisherState.LIVE
OOM = PublisherState.OOM
EXITED = PublisherState.EXITED
ERROR = PublisherState.ERROR
STATES: tuple[PublisherState, ...] = tuple(PublisherState)


@dataclass(frozen=True)
class TrainingProcess:
    """One publishing training process, as of the last poll."""

    pid: int
    hello: Hello | None
    snapshot: Snapshot | None
    state: PublisherState
    error: str | None = None  # why the reader was dropped (state "error"), or the hook's own degradation
    memory_history: tuple[int, ...] = ()  # measured_total, one per new snapshot, oldest first
    step_time_history: tuple[float, ...] = ()  # seconds, one per new snapshot that carried a step time
    rank_group: str | None = None  # processes of one multi-rank job share this key
    oom: str | None = None  # the out-of-memory exception text, when an OOM file exists for this PID
    path: Path | None = None  # the socket (or, for state "oom", the OOM file)
    updated_at: float | None = None  # monotonic time of the last new message
    # The PID the hook itself published, where it differs from ``pid`` (the kernel's, in our namespace):
    # a hook in a container sees itself as another PID.
    published_pid: int | None = None

    @property
    def rank(self) -> int | None:
        return self.hello.rank if self.hello is not None else None

    @property
    def total_bytes(self) -> int | None:
        return measured_total(self.snapshot) if self.snapshot is not None else None


def measured_total(snapshot: Snapshot) -> int:
    """The step's peak, the figure the anatomy table's rows add up to (one figure, one meaning in the
    table, its history and the JSON); from a hook that sends no peak, the sum of every component it
    measured (unmeasured ones count as nothing)."""
    if snapshot.peak_bytes is not None:
        return snapshot.peak_bytes
    return sum(v for v in snapshot.memory.values() if v is not None)


def rank_group_key(hello: Hello) -> str:
    """Ranks of one job: the launcher's run id (torchrun's, shared by every rank) where the hook sent one,
    else the same host, world size and model class."""
    if hello.run_id:
        return f"run|{hello.run_id}|{hello.world_size or 1}"
    return f"{hello.host}|{hello.world_size or 1}|{hello.model_class}"


@dataclass(frozen=True)
class TrainingReading:
    """One poll of the anatomy source: every known publisher, sorted by PID, and what kept the source
    from reading (a directory it refuses, an unexpected failure), each a ``SourceError``."""

    processes: tuple[TrainingProcess, ...] = ()
    errors: tuple[SourceError, ...] = ()

