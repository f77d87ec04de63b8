"""Reading the flight recorder's files: one run, a job's ranks, the list of recorded runs. Stdlib only
(no torch): the monitor's ``runs``, ``report`` and ``--replay`` read records through this module.

The format (version 2; a version 1 file reads the same, without what 2 added): JSON lines, UTF-8, one
record per line, each an object whose first key is ``type``. A line without its newline (a process
killed mid-write) is skipped, as is any line that does not parse; everything before it stands.

- ``record`` (the first line): ``format`` ("anatomy-top-record"), ``version``, ``created`` (Unix time),
  ``pid``, ``proc_start`` (2: the process's start, ``/proc/<pid>/stat`` field 22, clock ticks since boot;
  null where unknown: a PID alive with another start time is another process), ``host``, ``job`` (the
  launcher's run id), ``rank``, ``world_size``, ``max_bytes``, ``generation`` (how many times the file
  was rewritten to thin it: a reader following the file starts over when it changes).
- ``hello``: ``at`` (Unix time), ``step`` (the last step recorded before it), ``message`` (the protocol's
  hello, as published). The first is the run's set-up; each later one is a set-up change.
- ``snapshot``: ``message``, a protocol snapshot (at most about two a second; thinned when old).
- ``steps``: ``rows``, each ``[step, time, step_s, peak_bytes, forward_s, backward_s, optimizer_s,
  samples_per_s, n]``: one row per finished step, or, once thinned, ``n`` consecutive steps ending at
  ``step`` (mean times, largest peak). Rows may come in any order: sort them by step.
- ``oom``: ``message``, the snapshot written when the step died of out-of-memory (``oom`` set).
- ``end``: ``time``, ``how``, ``step``: the tracker closed; ``how`` is "finished", or (2) "crashed" with
  ``error`` (the exception's type and message) when the tracker or the process ended on an exception.
  No ``end``: the process was killed, or still runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anatomy import protocol, run_ending
from anatomy.protocol import Hello, Snapshot
from anatomy.recorder import FORMAT, SUFFIX, record_dir

MAX_READ_BYTES = 256 * 1024 * 1024  # a record is bounded (16 MiB); anything far larger is not one
JOB_WINDOW_S = 600.0  # ranks of one job start within this of each other
ENDINGS = ("finished", "oom", "crashed", "killed", "running")
FORMAT_VERSIONS = (1, 2)


@dataclass(frozen=True)
class StepRow:
    step: int
    time: float
    step_s: float | None
    peak_bytes: int | None
    forward_s: float | None
    backward_s: float | None
    optimizer_s: float | None
    samples_per_s: float | None
    n: int = 1


@dataclass
class Run:
    """One rank's record, read back."""

    path: Path
    header: dict[str, Any] = field(default_factory=dict)
    hellos: list[tuple[float | None, int | None, Hello]] = field(default_factory=list)  # (at, step, hello)
    snapshots: list[Snapshot] = field(default_factory=list)
    rows: list[StepRow] = field(default_factory=list)
    ooms: list[Snapshot] = field(default_factory=list)
    end: dict[str, Any] | None = None
    skipped: int = 0  # lines that did not parse (a torn last line among them)
    torn: bool = False  # the last line had no newline: the writer died mid-record

    @property
    def hello(self) -> Hello | None:
        return self.hellos[-1][2] if self.hellos else None

    @property
    def pid(self) -> int:
        return int(self.header.get("pid") or (self.hello.pid if self.hello else 0))

    @property
    def host(self) -> str:
        return str(self.header.get("host") or (self.hello.host if self.hello else ""))

    @property
    def rank(self) -> int | None:
        r = self.header.get("rank")
        return r if isinstance(r, int) else None

    @property
    def world_size(self) -> int | None:
        w = self.header.get("world_size")
        return w if isinstance(w, int) else None

    @property
    def job(self) -> str | None:
        j = self.header.get("job")
        return j if isinstance(j, str) else None

    @property
    def started_at(self) -> float:
        if self.hellos:
            return self.hellos[0][2].started_at
        return float(self.header.get("created") or 0.0)

    @property
    def model_class(self) -> str:
        return self.hello.model_class if self.hello else ""

    @property
    def last_step(self) -> int | None:
        last = [r.step for r in self.rows[-1:]] + [s.step for s in self.snapshots[-1:]]
        last += [s.step for s in self.ooms]
        return max(last, default=None)

    @property
    def steps(self) -> int:
        """Finished steps recorded (thinned rows count the steps they stand for)."""
        return sum(r.n for r in self.rows)

    @property
    def peak_bytes(self) -> int | None:
        peaks = [r.peak_bytes for r in self.rows if r.peak_bytes is not None]
        peaks += [s.peak_bytes for s in self.snapshots + self.ooms if s.peak_bytes is not None]
        return max(peaks) if peaks else None

    @property
    def last_time(self) -> float:
        times = [r.time for r in self.rows[-1:]] + [s.time for s in self.snapshots[-1:]]
        if self.end is not None and isinstance(self.end.get("time"), (int, float)):
            times.append(float(self.end["time"]))
        return max(times, default=self.started_at)

    @property
    def ended(self) -> str:
        """finished, oom, crashed, killed or running."""
        if self.ooms:
            return "oom"
        if self.end is not None:
            return str(self.end.get("how") or "finished")
        started = self.header.get("proc_start")
        alive = self.host == socket.gethostname() and self.pid > 0 and protocol.pid_alive(self.pid)
        if run_ending.same_process_alive(self.pid, started if isinstance(started, int) else None, alive):
            return "running"
        return "killed"

    @property
    def error(self) -> str | None:
        """The exception a crashed run ended on."""
        error = self.end.get("error") if self.end is not None else None
        return error if isinstance(error, str) else None


def _read_bytes(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if st.st_size > MAX_READ_BYTES:
            raise ValueError(f"{path} is larger than a record can be")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _row(raw: Any) -> StepRow | None:
    if not isinstance(raw, list) or len(raw) < 9:
        return None
    step, t, step_s, peak, fwd, bwd, opt, rate, n = raw[:9]
    if not isinstance(step, int) or not isinstance(t, (int, float)):
        return None

    def num(x: Any) -> float | None:
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None

    return StepRow(
        step=step,
        time=float(t),
        step_s=num(step_s),
        peak_bytes=peak if isinstance(peak, int) and not isinstance(peak, bool) else None,
        forward_s=num(fwd),
        backward_s=num(bwd),
        optimizer_s=num(opt),
        samples_per_s=num(rate),
        n=n if isinstance(n, int) and n > 0 else 1,
    )


def read_run(path: Path | str, snapshots: bool = True) -> Run:
    """The run recorded at ``path``. ``snapshots=False`` skips the snapshot lines unparsed (a listing
    needs only the header, the hellos, the step rows and how it ended)."""
    path = Path(path)
    data = _read_bytes(path)
    run = Run(path=path)
    lines = data.split(b"\n")
    tail = lines.pop()  # after the last newline: empty, or a record torn by a kill
    if tail.strip():
        run.torn = True
        run.skipped += 1
    rows: dict[int, StepRow] = {}
    for line in lines:
        if not line.strip():
            continue
        if not snapshots and line.startswith(b'{"type":"snapshot"'):
            continue
        try:
            _read_line(run, json.loads(line), rows)
        except (ValueError, TypeError, KeyError, RecursionError):
            run.skipped += 1
    if run.header.get("format") not in (None, FORMAT):
        raise ValueError(f"{path} is not an anatomy-top record")
    run.rows = [rows[k] for k in sorted(rows)]
    run.snapshots.sort(key=lambda s: (s.time, s.seq))
    return run


def _read_line(run: Run, obj: Any, rows: dict[int, StepRow]) -> None:
    if not isinstance(obj, dict):
        raise ValueError("not an object")
    kind = obj.get("type")
    if kind == "record":
        version = obj.get("version")
        if version not in FORMAT_VERSIONS:
            raise ValueError(f"record format version {version!r} is not one this reader knows")
        run.header = obj
    elif kind == "hello":
        hello = protocol.from_dict(obj["message"])
        if isinstance(hello, Hello):
            at, step = obj.get("at"), obj.get("step")
            run.hellos.append(
                (
                    float(at) if isinstance(at, (int, float)) else None,
                    step if isinstance(step, int) else None,
                    hello,
                )
            )
    elif kind in ("snapshot", "oom"):
        snap = protocol.from_dict(obj["message"])
        if isinstance(snap, Snapshot):
            (run.ooms if kind == "oom" else run.snapshots).append(snap)
    elif kind == "steps":
        for raw in obj.get("rows") or []:
            row = _row(raw)
            if row is not None:
                rows[row.step] = row
    elif kind == "end":
        run.end = obj
    # Unknown types: a newer writer's addition; ignored (the version rule of the protocol).


# -- the list of runs ----------------------------------------------------------------------------


@dataclass
class RunGroup:
    """A run as ``anatomy-top runs`` lists it: one process, or the ranks of one job."""

    id: str
    runs: list[Run]  # by rank

    @property
    def first(self) -> Run:
        return self.runs[0]

    @property
    def started_at(self) -> float:
        return min(r.started_at for r in self.runs)

    @property
    def ended(self) -> str:
        endings = {r.ended for r in self.runs}
        for how in ("oom", "running", "crashed", "killed"):
            if how in endings:
                return how
        return self.first.ended

    @property
    def steps(self) -> int:
        return max(r.steps for r in self.runs)

    @property
    def peak_bytes(self) -> int | None:
        peaks = [p for r in self.runs if (p := r.peak_bytes) is not None]
        return max(peaks) if peaks else None

    def to_json(self) -> dict[str, Any]:
        first = self.first
        return {
            "id": self.id,
            "path": str(first.path),
            "paths": [str(r.path) for r in self.runs],
            "pid": first.pid,
            "pids": [r.pid for r in self.runs],
            "host": first.host,
            "model_class": first.model_class,
            "started_at": self.started_at,
            "ranks": len(self.runs),
            "job": first.job,
            "steps": self.steps,
            "peak_bytes": self.peak_bytes,
            "ended": self.ended,
        }


def record_files(directory: Path | None = None) -> list[Path]:
    directory = directory if directory is not None else (record_dir(True) or Path("."))
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    out = []
    for entry in entries:
        if entry.name.endswith(SUFFIX):
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False):
                    out.append(Path(entry.path))
    return sorted(out)


def _stem(path: Path) -> str:
    return path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.stem


def group_runs(runs: list[Run]) -> list[RunGroup]:
    """Ranks of one job (the same job id and world size, started within JOB_WINDOW_S) as one group;
    newest first."""
    singles: list[RunGroup] = []
    jobs: dict[tuple[str, int], list[list[Run]]] = {}
    for run in sorted(runs, key=lambda r: r.started_at):
        world = run.world_size or 1
        if world <= 1:
            singles.append(RunGroup(_stem(run.path), [run]))
            continue
        clusters = jobs.setdefault((run.job or "none", world), [])
        for cluster in clusters:
            ranks = {r.rank for r in cluster}
            if run.rank not in ranks and abs(cluster[0].started_at - run.started_at) <= JOB_WINDOW_S:
                cluster.append(run)
                break
        else:
            clusters.append([run])
    groups = list(singles)
    for (job, _), clusters in jobs.items():
        for cluster in clusters:
            cluster.sort(key=lambda r: r.rank if r.rank is not None else 0)
            started = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(cluster[0].started_at))
            groups.append(RunGroup(f"job-{job[:40]}-{started}", cluster))
    groups.sort(key=lambda g: g.started_at, reverse=True)
    return groups


def list_runs(directory: Path | None = None, snapshots: bool = False) -> list[RunGroup]:
    """Every readable record in ``directory`` (default: where this user's runs record), grouped, newest
    first. Unreadable files are left out."""
    runs = []
    for path in record_files(directory):
        with contextlib.suppress(OSError, ValueError):
            runs.append(read_run(path, snapshots=snapshots))
    return group_runs(runs)


def resolve(spec: str, directory: Path | None = None) -> RunGroup:
    """RUN as the command line names it: ``last``, an id from ``runs`` (or a unique prefix of one), or a
    path to a record file (a rank's file brings its whole job). Raises LookupError."""
    path = Path(spec).expanduser()
    if spec not in ("last",) and (path.is_file() or path.suffix == ".jsonl"):
        run = read_run(path)
        if (run.world_size or 1) <= 1:
            return RunGroup(_stem(path), [run])
        siblings = [run]
        for other in record_files(path.parent):
            if other.resolve() != path.resolve():
                with contextlib.suppress(OSError, ValueError):
                    siblings.append(read_run(other))
        for group in group_runs(siblings):
            if any(r is run for r in group.runs):
                return group
        return RunGroup(_stem(path), [run])
    groups = list_runs(directory)
    if not groups:
        raise LookupError(f"no recorded runs in {directory or record_dir(True)}")
    if spec == "last":
        return _in_full(groups[0])
    exact = [g for g in groups if g.id == spec]
    found = exact or [g for g in groups if g.id.startswith(spec)]
    if len(found) == 1:
        return _in_full(found[0])
    if not found:
        raise LookupError(f"no recorded run {spec!r} (see 'anatomy-top runs')")
    raise LookupError(f"{spec!r} names {len(found)} runs: {', '.join(g.id for g in found[:5])}")


def _in_full(group: RunGroup) -> RunGroup:
    """The group read again with its snapshots (the listing skipped them)."""
    return RunGroup(group.id, [read_run(r.path) for r in group.runs])
