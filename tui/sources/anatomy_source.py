"""The monitor's view of training processes that publish their anatomy through the hook.

``AnatomySource.read()`` discovers hook sockets and OOM files in the runtime directory, keeps one
non-blocking ``protocol.Reader`` per socket and returns one ``TrainingProcess`` per publisher, with the
source's own failures beside them (``TrainingReading``). It never blocks for long (connects use a short
timeout), never raises, and holds bounded memory.

Stdlib only (plus anatomy.protocol): the monitor never imports torch.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from anatomy import protocol
from anatomy.protocol import FileIdentity, Hello, ProtocolError, Reader, Snapshot, file_identity
from anatomy.vocabulary import PublisherState
from tui.sources.hook_trust import foreign_server, impersonation
from tui.sources.model import SourceError
from tui.sources.oom_dismissals import read_marker, remove_orphan_markers, write_marker
from tui.sources.run_history import RunHistories

# The objects this source reports live in tui.sources.training; most readers import them from here.
from tui.sources.training import (
    ERROR,
    EXITED,
    LIVE,
    OOM,
    STATES,
    TrainingProcess,
    TrainingReading,
    measured_total,
    rank_group_key,
)

__all__ = [
    "ERROR",
    "EXITED",
    "LIVE",
    "OOM",
    "STATES",
    "AnatomySource",
    "TrainingProcess",
    "TrainingReading",
    "measured_total",
    "poll_once",
    "rank_group_key",
]

HISTORY_LEN = 120
# A publisher that went away stays on screen this long, marked "exited", so its last figures can be read.
EXITED_TTL_S = 120.0
# A socket that refused us or spoke nonsense is retried after this long, not on every poll.
RETRY_S = 5.0
CONNECT_TIMEOUT_S = 0.05
# A hook that turned us away because it serves its limit of readers is asked again this soon.
BUSY_RETRY_S = 1.0
# Bounds what a directory full of sockets (or a hostile one) can make the monitor hold.
MAX_PROCESSES = 256
SOURCE_NAME = "training data"  # how this source's own failures are labelled (SourceError.source)


@dataclass
class _Entry:
    """Mutable per-socket (or per-OOM-file) state kept between polls."""

    pid: int
    path: Path
    reader: Reader | None = None
    hello: Hello | None = None
    snapshot: Snapshot | None = None
    state: PublisherState = LIVE
    error: str | None = None
    memory_history: deque[int] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    step_time_history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_LEN))
    updated_at: float | None = None
    published_pid: int | None = None  # the hello's PID where it differs from the kernel's
    ended_at: float | None = None  # when the reader was dropped
    retry_at: float | None = None  # when a failed socket may be tried again
    identity: FileIdentity | None = None  # of the socket we connected to: a new one is a new hook

    def record(self, snapshot: Snapshot, now: float) -> None:
        # (seq, time) names a snapshot: a reconnect resends the latest one, a new tracker restarts seq.
        old = self.snapshot
        if old is not None and (old.seq, old.time) == (snapshot.seq, snapshot.time):
            return
        self.snapshot = snapshot
        self.updated_at = now
        self.memory_history.append(measured_total(snapshot))
        if snapshot.timing.step_s is not None:
            self.step_time_history.append(snapshot.timing.step_s)


@dataclass
class _OomEntry:
    pid: int
    path: Path
    mtime_ns: int
    hello: Hello | None
    snapshot: Snapshot | None
    error: str | None


class AnatomySource:
    """Discovers and reads the hooks' sockets. Call ``read()`` (or ``poll()``) from one thread at a time
    (a lock guards it anyway); ``close()`` may come from any thread."""

    def __init__(
        self,
        directory: Path | str | None = None,
        *,
        exited_ttl_s: float = EXITED_TTL_S,
        retry_s: float = RETRY_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        max_processes: int = MAX_PROCESSES,
        clock: Callable[[], float] = time.monotonic,
        owner: int | None = None,
        histories: RunHistories | None = None,
    ) -> None:
        """``owner``: the uid the directory and every socket's server must have (default: ours; root's
        exporter passes the user whose directory it reads). Anything else is refused, not read.
        ``histories``: where live processes' flight records are followed (the monitor's charts then
        reach back to each run's start); None: only what this source saw itself."""
        self._histories = histories
        self._directory = Path(directory) if directory is not None else None
        self._owner = os.geteuid() if owner is None else owner
        self._exited_ttl_s = exited_ttl_s
        self._retry_s = retry_s
        self._connect_timeout_s = connect_timeout_s
        self._max = max_processes
        self._clock = clock
        self._entries: dict[Path, _Entry] = {}
        self._ooms: dict[int, _OomEntry] = {}
        self._dismissed: dict[Path, int] = {}  # OOM file -> mtime_ns the user dismissed
        self._markers = False  # a dismissal marker was written or seen (only then are orphans looked for)
        self._ignored: dict[Path, FileIdentity] = {}  # dismissed socket -> its file identity
        self._lock = threading.Lock()
        self._closed = False

    @property
    def directory(self) -> Path:
        return self._directory if self._directory is not None else protocol.runtime_dir()

    # -- public ---------------------------------------------------------------------------------

    def read(self, wait_for_first_s: float = 0.0) -> TrainingReading:
        """Read what arrived: every known publisher, sorted by PID, and this source's own failures beside
        them. With ``wait_for_first_s`` (for ``--once``), wait up to that long in total for new sockets'
        first snapshot."""
        with self._lock:
            if self._closed:
                return TrainingReading()
            try:
                refused = protocol.untrusted_reason(self.directory, self._owner)
                if refused is not None:
                    # Someone else could have planted anything in it: read nothing, say why, once a poll.
                    self._close_readers()
                    return TrainingReading(errors=(SourceError(SOURCE_NAME, f"not reading {refused}"),))
                now = self._clock()
                self._discover(now)
                self._read_all(now)
                if wait_for_first_s > 0:
                    self._wait_first(wait_for_first_s)
                self._scan_oom()
                self._expire(self._clock())
                return TrainingReading(processes=tuple(self._with_records(self._view())))
            except Exception as exc:  # a monitor must keep running whatever the directory holds
                return TrainingReading(errors=(SourceError(SOURCE_NAME, repr(exc)),))

    def poll(self, wait_for_first_s: float = 0.0) -> list[TrainingProcess]:
        """The processes of one ``read`` (for callers that only wait for publishers: its errors are
        dropped)."""
        return list(self.read(wait_for_first_s).processes)

    def _with_records(self, processes: list[TrainingProcess]) -> list[TrainingProcess]:
        """Each process's history from its flight record, where there is one and it holds more."""
        histories = self._histories
        if histories is None:
            return processes
        out = []
        for p in processes:
            found = histories.lookup(p.hello) if p.hello is not None else None
            if found is not None and len(found.peaks) > len(p.memory_history):
                p = replace(p, memory_history=found.peaks, step_time_history=found.step_times)
            out.append(p)
        histories.forget_except({(p.hello.pid, p.hello.started_at) for p in processes if p.hello is not None})
        return out

    def dismiss(self, pid: int) -> bool:
        """Stop showing the OOM, exited or error records of ``pid``. An OOM record reappears only if a
        new OOM file is written (the dismissal is a marker file beside the record, so every monitor of
        this user honours it, now and later), a failed socket only if a new socket replaces it. Live
        ones stay."""
        with self._lock:
            removed = False
            oom = self._ooms.pop(pid, None)
            if oom is not None:
                removed = True
                self._dismissed[oom.path] = oom.mtime_ns
                write_marker(oom.path, oom.mtime_ns)
                self._markers = True
            for path, entry in list(self._entries.items()):
                if entry.pid == pid and entry.reader is None:
                    del self._entries[path]
                    identity = file_identity(path)
                    if identity is not None:
                        self._ignored[path] = identity
                    removed = True
            return removed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._close_readers()

    def _close_readers(self) -> None:
        for entry in self._entries.values():
            if entry.reader is not None:
                entry.reader.close()
                entry.reader = None
        self._entries.clear()
        self._ooms.clear()

    def __enter__(self) -> AnatomySource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------

    def _discover(self, now: float) -> None:
        found = protocol.discover(self.directory)
        self._ignored = {p: i for p, i in self._ignored.items() if p in found and file_identity(p) == i}
        for path in found:
            if path in self._ignored:
                continue
            entry = self._entries.get(path)
            if entry is not None and entry.reader is None and entry.retry_at is None:
                # Closed by the hook; the same process may have started a new tracker on this path.
                if file_identity(path) in (None, entry.identity):
                    continue
                entry.retry_at = now
            if entry is not None and (entry.reader is not None or now < (entry.retry_at or 0.0)):
                continue
            if entry is None and len(self._entries) >= self._max:
                continue
            pid = protocol.pid_from_path(path) or 0
            try:
                reader = Reader(path, timeout=self._connect_timeout_s)
            except OSError as exc:
                failed = entry or _Entry(pid=pid, path=path)
                failed.state, failed.error = ERROR, f"cannot connect to {path.name}: {exc.strerror or exc}"
                failed.retry_at, failed.ended_at = now + self._retry_s, now
                self._entries[path] = failed
                continue
            stranger = foreign_server(reader, self._owner)
            if stranger is not None:
                reader.close()
                failed = entry or _Entry(pid=pid, path=path)
                failed.state, failed.error = ERROR, stranger
                failed.retry_at, failed.ended_at = now + self._retry_s, now
                self._entries[path] = failed
                continue
            if entry is None or entry.hello is None:
                entry = _Entry(pid=pid, path=path)
            if reader.peer is not None and reader.peer.pid > 0:
                entry.pid = reader.peer.pid  # the kernel's word, not the file name's
            # A reconnect to a known socket keeps the history: same process, same job.
            entry.reader, entry.state, entry.error = reader, LIVE, None
            entry.identity = file_identity(path)
            entry.retry_at = entry.ended_at = None
            self._entries[path] = entry

    def _read_all(self, now: float) -> None:
        for entry in self._entries.values():
            if entry.reader is not None:
                self._read(entry, now)

    def _read(self, entry: _Entry, now: float) -> None:
        reader = entry.reader
        assert reader is not None
        failure: str | None = None
        try:
            reader.poll()
        except ProtocolError as exc:
            failure = f"protocol error: {exc}"
        except Exception as exc:
            failure = f"read failed: {exc!r}"
        if failure is None and reader.hello is not None:
            failure = impersonation(reader)
            if failure is not None:
                self._drop(entry, now, ERROR, failure)
                entry.retry_at = now + self._retry_s
                return
        # What arrived before a bad message is still good.
        if reader.hello is not None:
            entry.hello = reader.hello
            kernel_pid = reader.peer.pid if reader.peer is not None else 0
            if kernel_pid > 0:
                entry.pid = kernel_pid
                entry.published_pid = reader.hello.pid if reader.hello.pid != kernel_pid else None
            elif reader.hello.pid:
                entry.pid = reader.hello.pid
            if entry.updated_at is None:
                entry.updated_at = now
        if reader.snapshot is not None:
            entry.record(reader.snapshot, now)
        if failure is not None:
            self._drop(entry, now, ERROR, failure)
            entry.retry_at = now + self._retry_s
        elif reader.busy is not None and reader.hello is None:
            busy = reader.busy
            self._drop(
                entry, now, ERROR, f"busy: the hook serves {busy.readers} readers (its limit); retrying"
            )
            entry.retry_at = now + BUSY_RETRY_S
        elif reader.closed:
            self._drop(entry, now, EXITED, None)

    def _drop(self, entry: _Entry, now: float, state: PublisherState, error: str | None) -> None:
        if entry.reader is not None:
            entry.reader.close()
            entry.reader = None
        entry.state, entry.error, entry.ended_at = state, error, now

    def _wait_first(self, budget_s: float) -> None:
        deadline = time.monotonic() + budget_s
        while True:
            waiting = [
                e
                for e in self._entries.values()
                if e.reader is not None and (e.hello is None or e.snapshot is None)
            ]
            left = deadline - time.monotonic()
            if not waiting or left <= 0:
                return
            socks = [e.reader for e in waiting if e.reader is not None]
            try:
                ready, _, _ = select.select(socks, [], [], min(left, 0.1))
            except (OSError, ValueError):
                return
            now = self._clock()
            for entry in waiting:
                if entry.reader in ready:
                    self._read(entry, now)

    def _scan_oom(self) -> None:
        seen: set[int] = set()
        for path in protocol.discover_oom(self.directory):
            pid = protocol.pid_from_path(path)
            if pid is None:
                continue
            try:
                mtime_ns = path.lstat().st_mtime_ns
            except OSError:
                continue
            if self._dismissed.get(path) == mtime_ns:
                continue
            if read_marker(path) == mtime_ns:  # dismissed by this or another monitor
                self._dismissed[path] = mtime_ns
                self._markers = True
                continue
            seen.add(pid)
            known = self._ooms.get(pid)
            if known is not None and known.mtime_ns == mtime_ns:
                continue
            if len(self._ooms) >= self._max and known is None:
                continue
            try:
                hello, snapshot = protocol.read_oom_file(path)
                self._ooms[pid] = _OomEntry(pid, path, mtime_ns, hello, snapshot, None)
            except (OSError, ProtocolError) as exc:
                self._ooms[pid] = _OomEntry(pid, path, mtime_ns, None, None, f"unreadable OOM file: {exc}")
        for pid in set(self._ooms) - seen:
            del self._ooms[pid]
        gone = [p for p in self._dismissed if not p.exists()]
        for p in gone:
            del self._dismissed[p]
        if gone and self._markers:  # a dismissed record went away: its marker has nothing left to hide
            remove_orphan_markers(self.directory)

    def _expire(self, now: float) -> None:
        for path, entry in list(self._entries.items()):
            if entry.reader is not None or entry.ended_at is None:
                continue
            if entry.pid in self._ooms:
                continue  # kept as long as the OOM record is
            if entry.state == ERROR and entry.retry_at is not None and path.exists():
                continue  # still there: retried later, shown meanwhile
            if now - entry.ended_at > self._exited_ttl_s or (entry.state == ERROR and not path.exists()):
                del self._entries[path]

    def _view(self) -> list[TrainingProcess]:
        out: list[TrainingProcess] = []
        oom_pids_shown: set[int] = set()
        for entry in self._entries.values():
            oom = self._ooms.get(entry.pid)
            hello, snapshot, state = entry.hello, entry.snapshot, entry.state
            error, path = entry.error, entry.path
            oom_text = None
            if oom is not None:
                oom_pids_shown.add(entry.pid)
                oom_text = _oom_text(oom)
                newer_live = (
                    entry.reader is not None
                    and snapshot is not None
                    and (oom.snapshot is None or snapshot.time > oom.snapshot.time)
                )
                if not newer_live:
                    # The process died (or is dying) of OOM: its last anatomy is the file's.
                    state, path = OOM, oom.path
                    hello = oom.hello or hello
                    snapshot = oom.snapshot or snapshot
                    error = oom.error or error
            out.append(self._make(entry.pid, hello, snapshot, state, error, entry, oom_text, path))
        for pid, oom in self._ooms.items():
            if pid in oom_pids_shown:
                continue
            text = _oom_text(oom)
            out.append(self._make(pid, oom.hello, oom.snapshot, OOM, oom.error, None, text, oom.path))
        out.sort(key=lambda p: (p.pid, str(p.path)))
        return out

    @staticmethod
    def _make(
        pid: int,
        hello: Hello | None,
        snapshot: Snapshot | None,
        state: PublisherState,
        error: str | None,
        entry: _Entry | None,
        oom_text: str | None,
        path: Path | None,
    ) -> TrainingProcess:
        if error is None and snapshot is not None and snapshot.error:
            error = snapshot.error
        mem: tuple[int, ...] = tuple(entry.memory_history) if entry is not None else ()
        steps: tuple[float, ...] = tuple(entry.step_time_history) if entry is not None else ()
        if not mem and snapshot is not None:
            mem = (measured_total(snapshot),)
        return TrainingProcess(
            pid=pid,
            hello=hello,
            snapshot=snapshot,
            state=state,
            error=error,
            memory_history=mem,
            step_time_history=steps,
            rank_group=rank_group_key(hello) if hello is not None else None,
            oom=oom_text,
            path=path,
            updated_at=entry.updated_at if entry is not None else None,
            published_pid=entry.published_pid if entry is not None else None,
        )




def _oom_text(oom: _OomEntry) -> str:
    if oom.snapshot is not None and oom.snapshot.oom:
        return oom.snapshot.oom
    return oom.error or "out of memory"


def poll_once(directory: Path | str | None = None, wait_s: float = 1.0) -> TrainingReading:
    """Everything publishing right now, waiting up to ``wait_s`` in total for first snapshots (``--once``)."""
    with AnatomySource(directory) as source:
        return source.read(wait_for_first_s=wait_s)
