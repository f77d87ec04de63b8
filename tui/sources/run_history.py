"""A live training process's history from its flight-recorder file, so the monitor's charts reach back to
the run's start, not only to when the monitor started.

``RunHistories.lookup(hello)`` finds the record of a publishing process (its PID in the file name, its
header's PID and host, its first hello's start time) and follows it: each call reads only what was
appended since the last (at most every ``refresh_s``), and starts over when the recorder rewrote (thinned)
the file. What it keeps is bounded: step rows beyond ``MAX_ROWS`` are merged in pairs. Its history cuts the
run into buckets of equal step ranges (:mod:`tui.step_buckets`), as the replay and the report do: the
record's recent past is kept in full and its older history thinned, so buckets of a fixed number of rows
would give the recent part far more of a sparkline than its share of the steps. Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from anatomy.protocol import Hello
from anatomy.recorder import SUFFIX, record_dir
from tui.step_buckets import MAX, MEAN, even_series

MAX_ROWS = 20_000
POINTS = 600  # per series: more than a sparkline in the widest pane has cells
READ_BUDGET = 4 * 1024 * 1024  # bytes read per refresh: a monitor's poll must stay short
STEPS_PREFIX = b'{"type":"steps"'


@dataclass(frozen=True)
class History:
    peaks: tuple[int, ...]  # the largest peak of each equal range of steps, oldest first
    step_times: tuple[float, ...]  # the mean step time of each equal range of steps, oldest first
    first_step: int | None  # the first step the history covers (a thinned row stands for several)
    path: Path


class RecordTail:
    """Follows one record file: step rows only (peak, step time), appended lines read incrementally.
    At most ``max_rows`` rows are kept (beyond it, neighbours merge in pairs)."""

    def __init__(self, path: Path, max_rows: int = MAX_ROWS) -> None:
        self.path = path
        self.max_rows = max_rows
        self._identity: tuple[int, int, bytes] | None = None
        self._offset = 0
        self._partial = b""
        # last step -> (first step it stands for, peak, step time)
        self._rows: dict[int, tuple[int, int | None, float | None]] = {}
        self._first: int | None = None
        self._history: dict[int, History] = {}  # by points, until the rows change

    def poll(self) -> None:
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            # A rewrite (the recorder thinning the file) is a new file with a new header generation; an
            # inode number alone can come back after two rewrites.
            head = os.pread(fd, 1024, 0).split(b"\n", 1)[0]
            identity = (st.st_dev, st.st_ino, head)
            if identity != self._identity or st.st_size < self._offset:
                self._identity, self._offset, self._partial, self._rows = identity, 0, b"", {}
                self._first = None
                self._history.clear()
            data = os.pread(fd, min(READ_BUDGET, st.st_size - self._offset), self._offset)
        finally:
            os.close(fd)
        if not data:
            return
        self._history.clear()
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # not yet complete (being written, or torn by a kill)
        for line in lines:
            if line.startswith(STEPS_PREFIX):
                with contextlib.suppress(ValueError, TypeError, KeyError, RecursionError):
                    self._add(json.loads(line)["rows"])
        if len(self._rows) > self.max_rows:
            self._merge()

    def _add(self, rows: list[list[object]]) -> None:
        for row in rows:
            step, peak, step_s, n = row[0], row[3], row[2], row[8]
            if isinstance(step, int):
                start = step - (n - 1 if isinstance(n, int) and n > 1 else 0)
                self._first = start if self._first is None else min(self._first, start)
                self._rows[step] = (
                    start,
                    peak if isinstance(peak, int) else None,
                    float(step_s) if isinstance(step_s, (int, float)) else None,
                )

    def _merge(self) -> None:
        keys = sorted(self._rows)
        merged: dict[int, tuple[int, int | None, float | None]] = {}
        for a, b in zip(keys[0::2], keys[1::2], strict=False):
            (fa, pa, ta), (fb, pb, tb) = self._rows[a], self._rows[b]
            peaks = [p for p in (pa, pb) if p is not None]
            # The mean time of the steps the two stand for.
            timed = [(t, s) for t, s in ((ta, a - fa + 1), (tb, b - fb + 1)) if t is not None]
            weight = sum(s for _, s in timed)
            mean = sum(t * s for t, s in timed) / weight if timed else None
            merged[b] = (fa, max(peaks) if peaks else None, mean)
        if len(keys) % 2:
            merged[keys[-1]] = self._rows[keys[-1]]
        self._rows = merged

    def history(self, points: int = POINTS) -> History:
        """The whole run in at most ``points`` values per series, each an equal range of steps (its
        largest peak, its mean step time; :func:`tui.step_buckets.even_series`)."""
        found = self._history.get(points)
        if found is not None:
            return found
        keys = sorted(self._rows)
        rows = [self._rows[k] for k in keys]
        firsts = [r[0] for r in rows]
        found = self._history[points] = History(
            tuple(int(v) for v in even_series(keys, [r[1] for r in rows], points, MAX, firsts)),
            tuple(even_series(keys, [r[2] for r in rows], points, MEAN, firsts)),
            self._first,
            self.path,
        )
        return found


def _header(path: Path) -> tuple[dict[str, object], float | None]:
    """The record's header and its first hello's start time (the first few lines only)."""
    header: dict[str, object] = {}
    started: float | None = None
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        head = os.read(fd, 64 * 1024)
    finally:
        os.close(fd)
    for line in head.split(b"\n")[:4]:
        with contextlib.suppress(ValueError, TypeError, KeyError, AttributeError):
            obj = json.loads(line)
            if obj.get("type") == "record":
                header = obj
            elif obj.get("type") == "hello":
                started = float(obj["message"]["started_at"])
                break
    return header, started


class RunHistories:
    """The record of each live process, found once and followed."""

    def __init__(
        self,
        directory: Path | None = None,
        refresh_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._directory = directory
        self.refresh_s = refresh_s
        self._clock = clock
        self._tails: dict[tuple[int, float], RecordTail | None] = {}
        self._looked: dict[tuple[int, float], float] = {}
        self._polled: dict[tuple[int, float], float] = {}

    @property
    def directory(self) -> Path | None:
        return self._directory if self._directory is not None else record_dir()

    def lookup(self, hello: Hello) -> History | None:
        """The history recorded for the process that sent ``hello``, or None (no record, recording off)."""
        key = (hello.pid, hello.started_at)
        now = self._clock()
        tail = self._tails.get(key)
        if tail is None:
            if now - self._looked.get(key, -1e18) < self.refresh_s * 5:
                return None
            self._looked[key] = now
            path = self._find(hello)
            if path is None:
                return None
            tail = self._tails[key] = RecordTail(path)
        if now - self._polled.get(key, -1e18) >= self.refresh_s:
            self._polled[key] = now
            with contextlib.suppress(OSError):
                tail.poll()
        return tail.history()

    def forget_except(self, keys: set[tuple[int, float]]) -> None:
        for key in [k for k in self._tails if k not in keys]:
            self._tails.pop(key, None)
            self._polled.pop(key, None)
        for key in [k for k in self._looked if k not in keys]:
            self._looked.pop(key, None)

    def _find(self, hello: Hello) -> Path | None:
        directory = self.directory
        if directory is None:
            return None
        try:
            names = [e.name for e in os.scandir(directory) if e.name.endswith(SUFFIX)]
        except OSError:
            return None
        pid = str(hello.pid)
        for name in sorted(names, reverse=True):
            stem = name[: -len(SUFFIX)].split("-")
            if pid not in stem[-2:]:
                continue
            path = directory / name
            with contextlib.suppress(OSError):
                header, started = _header(path)
                same = header.get("pid") == hello.pid and header.get("host") == hello.host
                if same and (started is None or abs(started - hello.started_at) < 1.0):
                    return path
        return None
