"""The flight recorder's file as it keeps it in memory, compactly, and its thinning. Stdlib only.

What the recorder wrote is kept so that it can rewrite the file thinner: events and snapshots as the
bytes written (one ``bytearray``), step rows as typed columns (``array``), the order of the lines as four
``array`` columns. However long the run, that is a handful of objects the garbage collector never walks
(a list per step row was ~80,000 objects at 80,000 steps, ~25 MiB, and made every full collection in the
training process slower).

Thinning is by step, toward an even grid, so that after any number of rewrites the old history holds
about as many snapshots and step rows per step in its first tenth as in its last: snapshots keep the
first one in each cell of ``snapshot_grid`` steps, step rows merge within cells of ``row_grid`` steps
(their mean times, their largest peak, ``n`` the steps a row stands for). A grid only doubles, so its
cells nest: what a coarser grid keeps, a finer one kept, and an old part thinned before is thinned no
further until the whole older history needs it. The recent lines stay as they are.
"""

from __future__ import annotations

import itertools
import json
import math
from array import array
from collections.abc import Callable, Sequence
from typing import Any

EVENT, SNAPSHOT, STEPS = 0, 1, 2
# How many step rows one "steps" line holds at most (a thinned history is re-chunked to this).
ROWS_PER_LINE = 512
_NO_PEAK = -1  # a missing peak in the integer column (a peak is never negative)
_MEANS = (2, 4, 5, 6, 7)  # step_s, forward_s, backward_s, optimizer_s, samples_per_s

Row = list[Any]  # [step, time, step_s, peak_bytes, forward_s, backward_s, optimizer_s, samples_per_s, n]


def _n(x: float) -> float | None:
    return None if x != x else x  # NaN: not measured


def rounded(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.6g}")


def rows_line(rows: Sequence[Sequence[Any]]) -> bytes:
    """A steps line. A value not measured is None, or NaN in a float (the recorder's columns keep it so):
    either is written ``null`` (NaN and infinities are no JSON)."""
    text = json.dumps({"type": "steps", "rows": rows}, separators=(",", ":"))
    if "N" in text or "I" in text:  # (no other character of the line is a capital N or I)
        text = text.replace("-Infinity", "null").replace("Infinity", "null").replace("NaN", "null")
    return text.encode() + b"\n"


def merge(rows: Sequence[Sequence[Any]]) -> Row:
    """Consecutive rows as one: the last step and time, the times' means (weighted by the steps each
    row stands for, over the rows that measured them), the largest peak, the steps they stand for."""
    last = rows[-1]
    out: Row = [last[0], last[1], None, None, None, None, None, None, sum(int(r[8]) for r in rows)]
    for i in _MEANS:
        total = weight = 0.0
        for r in rows:
            if r[i] is not None:
                total += r[i] * r[8]
                weight += r[8]
        out[i] = rounded(total / weight) if weight else None
    peaks = [r[3] for r in rows if r[3] is not None]
    out[3] = max(peaks) if peaks else None
    return out


class StepColumns:
    """Step rows as nine typed columns: None is NaN in a float column, -1 in the peak column."""

    __slots__ = ("cols",)

    def __init__(self) -> None:
        self.cols: tuple[array[Any], ...] = tuple(array("q" if i in (0, 3, 8) else "d") for i in range(9))

    def __len__(self) -> int:
        return len(self.cols[0])

    def extend(self, rows: Sequence[Sequence[Any]]) -> None:
        nan = math.nan
        for i, col in enumerate(self.cols):
            if i == 3:
                col.extend(array("q", [_NO_PEAK if r[3] is None else r[3] for r in rows]))
            elif i in (0, 8):
                col.extend(array("q", [r[i] for r in rows]))
            else:
                col.extend(array("d", [nan if r[i] is None else r[i] for r in rows]))

    def extend_columns(self, columns: Sequence[Sequence[Any]]) -> None:
        """Rows given as their nine columns, each as its own column keeps it (-1 for a missing peak, NaN
        for a missing time)."""
        for mine, theirs in zip(self.cols, columns, strict=True):
            mine.extend(theirs if isinstance(theirs, array) else array(mine.typecode, theirs))

    def copy_from(self, other: StepColumns, start: int, stop: int) -> None:
        for mine, theirs in zip(self.cols, other.cols, strict=True):
            mine.extend(theirs[start:stop])

    def rows(self, start: int, stop: int) -> list[Row]:
        return [
            [s, t, _n(a), None if p == _NO_PEAK else p, _n(f), _n(b), _n(o), _n(r), n]
            for s, t, a, p, f, b, o, r, n in zip(*(c[start:stop] for c in self.cols), strict=True)
        ]


class RecordLog:
    """The lines of one record file, in order: ``kind`` (EVENT, SNAPSHOT, STEPS), ``length`` (bytes in
    the file), ``ref`` (an event's or snapshot's offset in ``blob``; a steps line's first row in
    ``rows``), ``aux`` (a snapshot's step; a steps line's row count). Steps lines hold their rows in
    order, so the rows of the lines before any line are a prefix of ``rows``."""

    __slots__ = ("aux", "blob", "kind", "length", "ref", "row_grid", "rows", "size", "snapshot_grid")

    def __init__(self) -> None:
        self._reset()
        self.snapshot_grid = 1  # steps per cell: the old history keeps one snapshot in each
        self.row_grid = 1  # steps per cell: each of the old history's rows stands for steps in one

    def _reset(self) -> None:
        self.kind = array("b")
        self.length = array("q")
        self.ref = array("q")
        self.aux = array("q")
        self.blob = bytearray()
        self.rows = StepColumns()
        self.size = 0  # bytes of the file

    def __len__(self) -> int:
        return len(self.kind)

    def add(self, kind: int, data: bytes | memoryview, step: int = -1) -> None:
        """An event or a snapshot (``step``: the snapshot's), as written."""
        self._entry(kind, len(data), len(self.blob), step)
        self.blob += data

    def add_steps(self, rows: Sequence[Sequence[Any]], length: int) -> None:
        """A steps line of ``length`` bytes holding ``rows``."""
        self._entry(STEPS, length, len(self.rows), len(rows))
        self.rows.extend(rows)

    def add_step_columns(self, columns: Sequence[Sequence[Any]], count: int, length: int) -> None:
        """A steps line of ``length`` bytes holding ``count`` rows given as their columns
        (:meth:`StepColumns.extend_columns`)."""
        self._entry(STEPS, length, len(self.rows), count)
        self.rows.extend_columns(columns)

    def _entry(self, kind: int, length: int, ref: int, aux: int) -> None:
        self.kind.append(kind)
        self.length.append(length)
        self.ref.append(ref)
        self.aux.append(aux)
        self.size += length

    def data(self, i: int) -> bytes:
        """Line ``i`` as it is in the file."""
        if self.kind[i] == STEPS:
            return rows_line(self.rows.rows(self.ref[i], self.ref[i] + self.aux[i]))
        return bytes(self.blob[self.ref[i] : self.ref[i] + self.length[i]])

    # -- thinning --------------------------------------------------------------------------------

    def thin(
        self, target: int, recent_budget: int, first: bytes, written: Callable[[], bytes | None]
    ) -> bytes:
        """Thin the older lines until the file is about ``target`` bytes, and return the new file:
        ``first`` (the header) for line 0, the events, the older snapshots and step rows on coarser
        grids (whichever takes more room first, so both shrink in balance: a run of slow steps keeps
        its rows fine, one of fast steps its snapshots), then the newest lines, up to
        ``recent_budget`` bytes, as they are. ``written()``: the file as it is (None: not what was
        written); lines that stay as they were are copied from it rather than encoded again."""
        split, recent = len(self), 0
        while split > 1 and recent + self.length[split - 1] <= recent_budget:
            split -= 1
            recent += self.length[split]
        events = [i for i in range(1, split) if self.kind[i] == EVENT]
        snaps = [i for i in range(split) if self.kind[i] == SNAPSHOT]
        lines = [i for i in range(split) if self.kind[i] == STEPS]
        row_end = self.ref[lines[-1]] + self.aux[lines[-1]] if lines else 0
        cols = self.rows.cols
        firsts = [s - n + 1 for s, n in zip(cols[0][:row_end], cols[8][:row_end], strict=True)]
        row_count = len(firsts)
        per_row = sum(self.length[i] for i in lines) / max(row_count, 1)
        fixed = len(first) + sum(self.length[i] for i in events) + recent
        snaps_done = rows_done = False
        for _ in range(256):
            snap_bytes = sum(self.length[i] for i in snaps)
            row_bytes = per_row * row_count
            if fixed + snap_bytes + row_bytes <= target or (snaps_done and rows_done):
                break
            if not snaps_done and (snap_bytes >= row_bytes or rows_done):
                thinner = self._thin_snapshots(snaps)
                snaps_done = thinner is None
                snaps = thinner or snaps
            else:
                fewer = self._coarser_grid(firsts, row_count)
                rows_done = fewer is None
                row_count = fewer or row_count
        # A steps line whose rows each stay alone in their cell (none merges with a neighbour, in it
        # or across its ends) stays as it is.
        grid = self.row_grid
        cells = [f // grid for f in firsts]
        merges = [k for k in range(1, row_end) if cells[k] == cells[k - 1]]
        return self._rebuild(split, first, sorted(events + snaps), lines, merges, written)

    def _thin_snapshots(self, snaps: list[int]) -> list[int] | None:
        """Fewer snapshots: those the grid keeps (the first in each cell), the grid doubled until that
        drops some; None when no grid can (a snapshot or none left)."""
        if len(snaps) < 2:
            return None
        steps = self.aux
        span = max(steps[i] for i in snaps) - min(steps[i] for i in snaps) + 1
        while True:
            seen: set[int] = set()
            kept = []
            for i in snaps:
                cell = steps[i] // self.snapshot_grid
                if cell not in seen:
                    seen.add(cell)
                    kept.append(i)
            if len(kept) < len(snaps):
                return kept
            if self.snapshot_grid > span:
                return None
            self.snapshot_grid *= 2

    def _coarser_grid(self, firsts: list[int], count: int) -> int | None:
        """Fewer rows (whose first steps are ``firsts``, ``count`` after merging on the grid so far):
        the grid doubled until merging the rows within each cell leaves fewer; how many, or None when
        no grid can."""
        if count < 2:
            return None
        span = max(firsts) - min(firsts) + 1
        while True:
            grid = self.row_grid
            cells = len({f // grid for f in firsts})
            if cells < count:
                return cells
            if grid > span:
                return None
            self.row_grid *= 2

    def _rebuild(
        self,
        split: int,
        first: bytes,
        keep: list[int],
        lines: list[int],
        merges: list[int],
        written: Callable[[], bytes | None],
    ) -> bytes:
        """The log anew, and the file's content: line 0 (``first``), the older lines in ``keep`` (in
        order), the older rows after them (the steps ``lines``, those with a row in ``merges``
        merged on the grid and re-chunked), then the recent lines as they were."""
        old_kind, old_length, old_ref, old_aux = self.kind, self.length, self.ref, self.aux
        blob, old_rows = memoryview(self.blob), self.rows
        file = written()
        if file is not None and len(file) != self.size:
            file = None
        offsets = list(itertools.accumulate(old_length, initial=0)) if file is not None else []
        self._reset()
        parts: list[bytes | memoryview] = [first]
        self.add(old_kind[0], first, old_aux[0])
        for i in keep:
            data = blob[old_ref[i] : old_ref[i] + old_length[i]]
            parts.append(data)
            self.add(old_kind[i], data, old_aux[i])
        fresh: list[int] = []  # lines whose rows are merged and re-chunked

        def flush() -> None:
            if not fresh:
                return
            a, b = old_ref[fresh[0]], old_ref[fresh[-1]] + old_aux[fresh[-1]]
            rows = _merged(old_rows.rows(a, b), self.row_grid)
            for c in range(0, len(rows), ROWS_PER_LINE):
                chunk = rows[c : c + ROWS_PER_LINE]
                data = rows_line(chunk)
                parts.append(data)
                self.add_steps(chunk, len(data))
            fresh.clear()

        merging = iter(merges)
        next_merge = next(merging, None)
        for i in lines:
            a, b = old_ref[i], old_ref[i] + old_aux[i]
            while next_merge is not None and next_merge < a:
                next_merge = next(merging, None)
            # Merge k joins rows k-1 and k: one at a..b touches this line (a: with the line before it,
            # b: with the line after it).
            if file is None or (next_merge is not None and next_merge <= b):
                fresh.append(i)
                continue
            flush()
            assert file is not None
            parts.append(memoryview(file)[offsets[i] : offsets[i] + old_length[i]])
            self._entry(STEPS, old_length[i], len(self.rows), old_aux[i])
            self.rows.copy_from(old_rows, a, b)
        flush()
        for i in range(split, len(old_kind)):
            start, length = old_ref[i], old_length[i]
            if old_kind[i] == STEPS:
                self._entry(STEPS, length, len(self.rows), old_aux[i])
                self.rows.copy_from(old_rows, start, start + old_aux[i])
            else:
                self.add(old_kind[i], blob[start : start + length], old_aux[i])
        if file is not None:
            parts.append(memoryview(file)[offsets[split] :])
        else:  # the file is not what was written: the recent lines from here
            parts.extend(self.data(i) for i in range(len(self) - (len(old_kind) - split), len(self)))
        return b"".join(parts)


def _merged(rows: list[Row], grid: int) -> list[Row]:
    """``rows`` (in step order) with those in one cell of ``grid`` steps merged (rows never straddle a
    cell: the grid doubles from one step)."""
    out: list[Row] = []
    group: list[Row] = []
    cell = None
    for row in rows:
        here = (row[0] - row[8] + 1) // grid
        if group and here != cell:
            out.append(group[0] if len(group) == 1 else merge(group))
            group = []
        group.append(row)
        cell = here
    if group:
        out.append(group[0] if len(group) == 1 else merge(group))
    return out
