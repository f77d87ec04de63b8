"""The flight recorder: what the hook publishes, kept in one file per run. Stdlib only.

Everything here runs on the publisher's thread (``Publisher`` calls :meth:`Recorder.tick` at its publish
interval and :meth:`Recorder.close` when it closes): the training thread only writes each finished
step's numbers into the step feed (:class:`anatomy.step_feed.StepFeed`, O(1), no object per step), which
the recorder follows and takes in batches — its rows as columns, no snapshot per step — so recording
never blocks or slows a step. Any error (a full
or read-only disk, a directory someone else owns) turns recording off with one log line; nothing is
raised.

Where: ``$ANATOMY_TOP_RECORD`` when it names a directory, else ``$XDG_STATE_HOME/anatomy-top/runs``
(default ``~/.local/state/anatomy-top/runs``); ``ANATOMY_TOP_RECORD=0`` turns recording off, and
``anatomy.track(..., record=False | True | PATH)`` says the same in code. The directory is 0700, each
file 0600. The format (JSON lines, versioned) is described in :mod:`anatomy.runs` and the README.

Bounded: a run's file stays under ``max_bytes`` (16 MiB). When it grows past three quarters of that, the
file is rewritten (a new file, then an atomic rename: a crash mid-rewrite leaves the old one whole):
events (hellos, the OOM, the end) are kept, the newest quarter of the budget is kept in full, and older
history is resampled by step toward an even grid (:mod:`anatomy.record_log`): one snapshot per cell of
steps, step rows merged within cells (their mean times, their largest peak, ``n`` the steps a row
stands for), the cells doubling as the run grows, so a week-long run keeps its whole shape, as much
detail in its first day as in its sixth. What was written is kept in memory compactly (bytes and
typed columns: a handful of objects however long the run), to rewrite the file without parsing it.
Old runs are pruned, oldest first, once the directory holds more than ``max_total_bytes`` (1 GiB).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import re
import stat
import time
from array import array
from collections.abc import Iterable
from itertools import repeat
from pathlib import Path
from typing import Any

from anatomy import protocol, run_ending
from anatomy.protocol import Hello, Snapshot
from anatomy.record_log import EVENT, SNAPSHOT, RecordLog, rounded, rows_line
from anatomy.rundir import ensure_private_dir
from anatomy.step_feed import (
    BACKWARD_S,
    FORWARD_S,
    OPTIMIZER_S,
    PEAK,
    SAMPLES_PER_S,
    STEP,
    STEP_S,
    TIME,
    StepFeed,
    StepRows,
)

log = logging.getLogger("anatomy")

FORMAT = "anatomy-top-record"
FORMAT_VERSION = 2  # 2: the header's proc_start, an end's "crashed" and error
ENV_RECORD = "ANATOMY_TOP_RECORD"
SUFFIX = ".anatomy.jsonl"
MAX_RUN_BYTES = 16 * 1024 * 1024
MAX_TOTAL_BYTES = 1024 * 1024 * 1024
_OFF = ("0", "false", "no", "off")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")

RecordSetting = bool | str | os.PathLike[str] | None


def default_dir() -> Path:
    """``$XDG_STATE_HOME/anatomy-top/runs``, ``~/.local/state/anatomy-top/runs`` without it."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "anatomy-top" / "runs"


def record_dir(setting: RecordSetting = None) -> Path | None:
    """Where a run records, or None when recording is off. ``setting``: the ``record=`` argument of
    ``track`` (None: the environment decides; False: off; True: on, where the environment says; a path:
    that directory)."""
    if setting is False:
        return None
    if setting is not None and setting is not True:
        return Path(os.fspath(setting)).expanduser()
    env = os.environ.get(ENV_RECORD, "").strip()
    if env.lower() in _OFF:
        return None if setting is None else default_dir()
    if env and env.lower() not in ("1", "true", "yes", "on"):
        return Path(env).expanduser()
    return default_dir()


def _safe(text: str, limit: int = 40) -> str:
    return _SAFE.sub("_", text)[:limit] or "_"


def file_name(hello: Hello) -> str:
    """``<UTC start>-<host>-<pid>`` for one process; a rank of a job is ``job-<run id>-r<rank>-<UTC
    start>-<host>-<pid>``, so the ranks of a job sort together and name their job."""
    started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(hello.started_at))
    tail = f"{started}-{_safe(hello.host)}-{hello.pid}"
    if hello.world_size is not None and hello.world_size > 1:
        job = _safe(hello.run_id or "none")
        return f"job-{job}-r{hello.rank if hello.rank is not None else 0}-{tail}{SUFFIX}"
    return f"{tail}{SUFFIX}"


def step_row(snap: Snapshot) -> list[Any]:
    """One step as the record keeps it: ``[step, time, step_s, peak_bytes, forward_s, backward_s,
    optimizer_s, samples_per_s, n]`` (``n``: how many steps the row stands for; 1 until thinned)."""
    t = snap.timing
    return [
        snap.step,
        round(snap.time, 3),
        rounded(t.step_s),
        snap.peak_bytes,
        rounded(t.forward_s),
        rounded(t.backward_s),
        rounded(t.optimizer_s),
        rounded(t.samples_per_s),
        1,
    ]


def feed_rows(got: StepRows) -> tuple[list[Any], bytes]:
    """The step feed's rows as the record's nine columns and their steps line: ``step_row``'s values
    (times to six significant digits, the time to the millisecond, a missing figure null — NaN in a float
    column, -1 in the peak column — ``n`` 1), each number formatted once, by C-level maps over a column:
    no Python call per row on the publisher's thread, which shares the GIL with training."""
    n = got.count
    col = got.column
    six = "%.6g".__mod__
    timed = [list(map(six, col(k))) for k in (STEP_S, FORWARD_S, BACKWARD_S, OPTIMIZER_S, SAMPLES_PER_S)]
    steps = list(map("%d".__mod__, col(STEP)))
    times = list(map("%.3f".__mod__, col(TIME)))
    peaks = col(PEAK)
    if any(map(math.isnan, peaks)):  # no memory backend: a missing peak
        peak_col = array("q", [-1 if p != p else int(p) for p in peaks])
        peak_text = ["null" if p < 0 else str(p) for p in peak_col]
    else:
        peak_col = array("q", map(int, peaks))
        peak_text = list(map("%d".__mod__, peak_col))
    rows = zip(steps, times, timed[0], peak_text, *timed[1:], ["1"] * n, strict=True)
    line = '{"type":"steps","rows":[[' + "],[".join(map(",".join, rows)) + "]]}\n"
    if "n" in line:  # (no other letter n in the line: "nan", "inf" or a missing peak's "null")
        line = line.replace("-inf", "null").replace("inf", "null").replace("nan", "null")
    columns = [
        array("q", map(int, col(STEP))),
        array("d", map(float, times)),
        array("d", map(float, timed[0])),
        peak_col,
        *(array("d", map(float, t)) for t in timed[1:]),
        array("q", repeat(1, n)),
    ]
    return columns, line.encode()


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def _wrap(kind: str, message: bytes, extra: dict[str, Any] | None = None) -> bytes:
    """``{"type": kind, ...extra, "message": <the protocol line>}``: the type first, so a reader can skip
    what it does not need without parsing it, and the message exactly as it went on the wire."""
    head = json.dumps({"type": kind, **(extra or {})}, separators=(",", ":"))[:-1]
    return head.encode() + b',"message":' + message.rstrip(b"\n") + b"}\n"


class Recorder:
    """One run's record file. Used by the publisher's thread only (no lock needed)."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = MAX_RUN_BYTES,
        max_total_bytes: int = MAX_TOTAL_BYTES,
        snapshot_interval_s: float = 0.5,
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max(int(max_bytes), 64 * 1024)
        self.max_total_bytes = int(max_total_bytes)
        self.snapshot_interval_s = float(snapshot_interval_s)
        self.path: Path | None = None
        self.off = False
        self.rewrites = 0
        self._fd: int | None = None
        self._log = RecordLog()
        self._hello: Hello | None = None
        self._last_snap: Snapshot | None = None
        self._last_snap_at = -1e18
        self._newest: Snapshot | None = None  # the newest snapshot handed over (an OOM's aside)
        self._feed: StepFeed | None = None  # followed: every finished step's row is taken from it
        self._cursor = 0
        self._written: Snapshot | None = None  # the newest snapshot written
        self._ended = False
        self._header: dict[str, Any] = {}
        self._crash: str | None = None
        run_ending.watch_for_crash()

    @classmethod
    def from_setting(cls, setting: RecordSetting, interval_s: float = 0.5) -> Recorder | None:
        directory = record_dir(setting)
        return None if directory is None else cls(directory, snapshot_interval_s=interval_s)

    def follow(self, feed: StepFeed) -> None:
        """Take every finished step's row from ``feed`` (at each tick, on the caller's thread), and the
        newest step's snapshot from it at most once per ``snapshot_interval_s``."""
        self._feed = feed
        self._cursor = 0

    # -- the publisher thread's calls ------------------------------------------------------------

    def tick(self, hello: Hello, snapshots: Iterable[Snapshot], final: bool = False) -> None:
        """Record ``hello`` if it changed and the steps in ``snapshots`` (every step's row; the
        snapshot itself at most once per ``snapshot_interval_s``, an OOM's or the final one always)."""
        if self.off or self._ended:
            return
        try:
            self._tick(hello, list(snapshots), final)
        except Exception as exc:  # a full or read-only disk, a foreign directory: stop, say it once
            self._stop(exc)

    def crashed(self, exc: BaseException) -> None:
        """The run is ending on ``exc`` (a tracker left by an exception): the end record will say
        "crashed" and name it (a successful ``sys.exit()`` is no crash)."""
        if run_ending.is_crash(exc):
            self._crash = run_ending.describe(exc)

    def close(self, hello: Hello, snapshots: Iterable[Snapshot], how: str | None = None) -> None:
        """The last steps, then the end record: "finished", or "crashed" with the exception when the
        tracker or the process is ending on one (an OOM is its own record)."""
        self.tick(hello, snapshots, final=True)
        if self.off or self._ended or self._fd is None:
            self._close_fd()
            return
        self._ended = True
        try:
            last = self._last_snap
            error = self._crash or run_ending.crash()
            end: dict[str, Any] = {
                "type": "end",
                "time": round(time.time(), 3),
                "how": how or ("crashed" if error else "finished"),
                "step": last.step if last is not None else None,
            }
            if error and end["how"] == "crashed":
                end["error"] = error
            self._append(EVENT, _line(end))
        except Exception as exc:
            self._stop(exc)
        self._close_fd()

    # -- internals -------------------------------------------------------------------------------

    def _tick(self, hello: Hello, snapshots: list[Snapshot], final: bool) -> None:
        if self._fd is None:
            self._open(hello)
        if hello is not self._hello:
            if self._hello is None or protocol.to_dict(hello) != protocol.to_dict(self._hello):
                last = self._last_snap
                at = {"at": round(time.time(), 3), "step": last.step if last is not None else None}
                self._append(EVENT, _wrap("hello", protocol.encode(hello), at))
            self._hello = hello
        rows: list[list[Any]] = []
        seen: set[int] = set()
        for snap in snapshots:
            if snap.oom is None and id(snap) not in seen:
                seen.add(id(snap))  # the final snapshot may come twice (published, then on close)
                rows.append(step_row(snap))
        if rows:
            self._append_rows(rows)
        feed = self._feed
        if feed is not None:
            got, self._cursor = feed.rows_since(self._cursor)
            if got.count:
                self._append_feed_rows(got)
        now = time.monotonic()
        for snap in snapshots:
            if snap.oom is not None:  # an event: never thinned
                self._append(EVENT, _wrap("oom", protocol.encode(snap)))
                self._last_snap = snap
        plain = [s for s in snapshots if s.oom is None]
        due = final or now - self._last_snap_at >= self.snapshot_interval_s
        if plain:
            self._newest = plain[-1]
        elif feed is not None and due:
            self._newest = feed.latest() or self._newest
        latest = self._newest  # (on close: the last step's, even if its tick came too soon to write it)
        if latest is not None and latest is not self._written and due:
            self._append(SNAPSHOT, _wrap("snapshot", protocol.encode(latest)), latest.step)
            self._last_snap = self._written = latest
            self._last_snap_at = now

    def _open(self, hello: Hello) -> None:
        directory = ensure_private_dir(self.directory)
        self._prune(directory)
        path = directory / file_name(hello)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:  # a second tracker in this process, same second: take another name
            path = path.with_name(path.name[: -len(SUFFIX)] + f"-{time.monotonic_ns() % 100000}{SUFFIX}")
            fd = os.open(path, flags, 0o600)
        self._fd, self.path = fd, path
        header = {
            "type": "record",
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "created": round(time.time(), 3),
            "pid": hello.pid,
            # With the PID, tells this process from a later one given its PID (anatomy.run_ending).
            "proc_start": run_ending.process_start(hello.pid),
            "host": hello.host,
            "job": hello.run_id,
            "rank": hello.rank,
            "world_size": hello.world_size,
            "max_bytes": self.max_bytes,
            "generation": 0,  # bumped at each rewrite: a reader following the file knows to start over
        }
        self._header = header
        self._append(EVENT, _line(header))

    def _append(self, kind: int, data: bytes, step: int = -1) -> None:
        if self._fd is None:
            return
        _write_all(self._fd, data)
        self._log.add(kind, data, step)
        self._grown()

    def _append_rows(self, rows: list[list[Any]]) -> None:
        if self._fd is None:
            return
        data = rows_line(rows)
        _write_all(self._fd, data)
        self._log.add_steps(rows, len(data))
        self._grown()

    def _append_feed_rows(self, got: StepRows) -> None:
        if self._fd is None:
            return
        columns, data = feed_rows(got)
        _write_all(self._fd, data)
        self._log.add_step_columns(columns, got.count, len(data))
        self._grown()

    def _grown(self) -> None:
        if self._log.size > self.max_bytes * 3 // 4:
            self._rewrite()

    def _rewrite(self) -> None:
        """Thin the older history until the file is at most half its budget, then swap it in."""
        self._header["generation"] = self.rewrites + 1
        fd = self._fd

        def as_written() -> bytes | None:
            """The file as it is: lines that stay are copied from it rather than encoded again."""
            return None if fd is None else _read_all(fd)

        data = self._log.thin(self.max_bytes // 2, self.max_bytes // 4, _line(self._header), as_written)
        assert self.path is not None
        tmp = self.path.with_name(self.path.name + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        os.close(fd)
        os.replace(tmp, self.path)
        self._close_fd()
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        self.rewrites += 1

    def _prune(self, directory: Path) -> None:
        """Oldest runs first, until the directory holds at most ``max_total_bytes`` (what this run
        will add included): never a file of a process that still runs."""
        files: list[tuple[float, int, Path]] = []
        for entry in os.scandir(directory):
            if not (entry.name.endswith(SUFFIX) or entry.name.endswith(SUFFIX + ".tmp")):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    files.append((st.st_mtime, st.st_size, Path(entry.path)))
        total = sum(size for _, size, _ in files) + self.max_bytes
        for _, size, path in sorted(files):
            if total <= self.max_total_bytes:
                break
            pid = _pid_of(path.name)
            if pid is not None and pid != os.getpid() and _still_running(path, pid):
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                total -= size

    def _stop(self, exc: BaseException) -> None:
        self.off = True
        self._close_fd()
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
            why = "the disk is full" if exc.errno != errno.EROFS else "the disk is read-only"
        else:
            why = str(exc) or type(exc).__name__
        log.warning("anatomy-top: recording stopped (%s); training and publishing go on", why)

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    parts, offset = [], 0
    while offset < size and (chunk := os.pread(fd, size - offset, offset)):
        parts.append(chunk)
        offset += len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _still_running(path: Path, pid: int) -> bool:
    """Whether the process that records into ``path`` still runs (its PID alive, and started when the
    header says: not a later process given the same PID)."""
    if not protocol.pid_alive(pid):
        return False
    started = None
    with contextlib.suppress(OSError, ValueError):
        with open(path, "rb") as f:
            header = json.loads(f.readline(4096))
        if isinstance(header, dict) and isinstance(header.get("proc_start"), int):
            started = header["proc_start"]
    return run_ending.same_process_alive(pid, started, True)


_PID_RE = re.compile(r"-(\d+)(?:-\d+)?\.anatomy\.jsonl(?:\.tmp)?$")


def _pid_of(name: str) -> int | None:
    m = _PID_RE.search(name)
    return int(m.group(1)) if m else None
