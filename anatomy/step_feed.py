"""Every finished step as the training thread leaves it: raw values in a preallocated ring, made into a
snapshot only where one is wanted. Stdlib only.

An ordinary step's snapshot is the last one built in full with the step's number, time and timing (every
other figure is the same; a step whose forward the hook did not watch — its row's forward and backward
NaN — shows that build's forward and backward times, scaled to its own time outside the optimizer; one that
timed its optimizer neither, all three of the build's, scaled to its step).
Making that snapshot on the training thread at every step cost ~25 µs and objects the garbage collector had
to walk; here the training thread writes the step's
numbers into columns allocated once (:meth:`StepFeed.put`, or the tracker's inline copy of it: no object is
made), and a :class:`~anatomy.protocol.Snapshot` is made from a row only on demand — by the publisher's
thread when it sends (about twice a second), by ``tracker.latest`` / ``tracker.history``. The flight
recorder takes the rows themselves (:meth:`StepFeed.rows_since`), no snapshot per step.

One writer (the training thread), any number of readers on other threads, no lock: a row is complete
before ``written`` counts it (a single attribute store under the GIL), and a reader that copied rows
checks ``written`` again afterwards: a row the writer may have reused meanwhile (it is ``capacity`` steps
ahead) is dropped, never read torn.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from anatomy.protocol import Snapshot, Timing

CAPACITY = 4096  # rows kept: 8,000 steps/s for a publisher thread that drains every 0.5 s
MASK = CAPACITY - 1
# The row's columns, in one float array (stride WIDTH). NaN: not measured (None).
STEP, SEQ, TIME, STEP_S, FORWARD_S, BACKWARD_S, OPTIMIZER_S, SAMPLES_PER_S, TOKENS_PER_S, PEAK = range(10)
WIDTH = 10
_NAN = math.nan


def _value(x: float | None) -> float:
    return _NAN if x is None else float(x)


def _opt(x: float) -> float | None:
    return None if x != x else x  # NaN: not measured


def _built_split(
    built: Timing, step_s: float | None, optimizer_s: float | None
) -> tuple[float | None, float | None, float | None]:
    """The forward, backward and optimizer times of a step that did not time its forward and backward: the
    built step's, scaled by the two steps' time outside the optimizer — so that with this step's own
    optimizer time they never add up to more than its step (the built step was one that looked, its forward
    slower for it). A step that did not time its optimizer either (a resting step's update): all three the
    built step's, scaled by the two steps' times."""
    forward_s, backward_s = built.forward_s, built.backward_s
    if forward_s is None or backward_s is None or step_s is None or built.step_s is None:
        return forward_s, backward_s, optimizer_s
    if optimizer_s is None:
        if built.step_s <= 0.0:
            return forward_s, backward_s, built.optimizer_s
        scale = step_s / built.step_s
        opt = None if built.optimizer_s is None else built.optimizer_s * scale
        return forward_s * scale, backward_s * scale, opt
    rest, built_rest = step_s - optimizer_s, built.step_s - (built.optimizer_s or 0.0)
    if rest <= 0.0 or built_rest <= 0.0:
        return forward_s, backward_s, optimizer_s
    scale = rest / built_rest
    return forward_s * scale, backward_s * scale, optimizer_s


@dataclass(frozen=True, slots=True)
class StepRows:
    """Rows copied out of the feed, oldest first: ``values`` (stride :data:`WIDTH`), ``count`` rows, and
    ``lost``: rows the writer reused before this reader took them (a reader held up for ``CAPACITY``
    steps)."""

    values: array[float]
    count: int
    lost: int = 0

    def column(self, index: int) -> array[float]:
        return self.values[index::WIDTH]


class StepFeed:
    """The ring of finished steps. ``put`` (or the tracker's inline copy of it) on the training thread;
    ``latest``, ``snapshot``, ``rows_since`` from anywhere."""

    __slots__ = ("_made", "bases", "values", "written")

    def __init__(self) -> None:
        self.values = array("d", bytes(8 * CAPACITY * WIDTH))  # zeros: no row is read before written
        # The snapshot each row repeats: the last one built in full (a built row's own snapshot).
        self.bases: list[Snapshot | None] = [None] * CAPACITY
        self.written = 0  # rows written so far (the next row's number)
        self._made: tuple[int, Snapshot] | None = None  # the newest row made into a snapshot, kept

    # -- the training thread -------------------------------------------------------------------------

    def put(
        self, base: Snapshot, seq: int, when: float, step: int, timing: Timing, replace: bool = False
    ) -> None:
        """A finished step: ``base`` with this step's ``seq``, ``when``, ``step`` and ``timing`` (``base``
        itself for a step built in full: the same ``seq``). ``replace``: the last row is this same step,
        made anew (a reader that took the old row keeps it; no second row for the step)."""
        w = self.written
        replace = replace and w > 0
        if replace:
            w -= 1
        i = w & MASK
        o = i * WIDTH
        v = self.values
        v[o + STEP] = step
        v[o + SEQ] = seq
        v[o + TIME] = when
        v[o + STEP_S] = _value(timing.step_s)
        v[o + FORWARD_S] = _value(timing.forward_s)
        v[o + BACKWARD_S] = _value(timing.backward_s)
        v[o + OPTIMIZER_S] = _value(timing.optimizer_s)
        v[o + SAMPLES_PER_S] = _value(timing.samples_per_s)
        v[o + TOKENS_PER_S] = _value(timing.tokens_per_s)
        v[o + PEAK] = _value(base.peak_bytes)
        self.bases[i] = base
        self.written = w + 1
        if replace:
            self._made = None  # (after the row: a reader may have kept the old one meanwhile)

    def put_built(self, snap: Snapshot, replace: bool = False) -> None:
        """A step built in full."""
        again = replace and self.latest_step() == snap.step
        self.put(snap, snap.seq, snap.time, snap.step, snap.timing, again)

    def latest_step(self) -> int | None:
        w = self.written
        return int(self.values[((w - 1) & MASK) * WIDTH + STEP]) if w else None

    # -- any thread ----------------------------------------------------------------------------------

    def latest(self) -> Snapshot | None:
        """The newest step's snapshot (made once per step, then kept)."""
        w = self.written
        if w == 0:
            return None
        made = self._made
        if made is not None and made[0] == w - 1:
            return made[1]
        snap = self._make(w - 1)
        if snap is not None:
            self._made = (w - 1, snap)
        return snap

    def snapshot(self, k: int) -> Snapshot | None:
        """Row ``k``'s snapshot; None once the ring has moved past it (or before it is written)."""
        w = self.written
        if k < 0 or k >= w:
            return None
        made = self._made
        if made is not None and made[0] == k:
            return made[1]
        snap = self._make(k)
        if snap is not None and k == w - 1:
            self._made = (k, snap)  # the newest: the one ``latest`` returns
        return snap

    def _make(self, k: int) -> Snapshot | None:
        i = k & MASK
        o = i * WIDTH
        row = self.values[o : o + WIDTH]
        base = self.bases[i]
        if self.written - k >= CAPACITY or base is None:  # reused while being read (or never written)
            return None
        seq = int(row[SEQ])
        if base.seq == seq:
            return base  # built in full
        step_s, optimizer_s = _opt(row[STEP_S]), _opt(row[OPTIMIZER_S])
        forward_s, backward_s = _opt(row[FORWARD_S]), _opt(row[BACKWARD_S])
        if forward_s is None and backward_s is None:  # a step whose forward ran unwatched
            forward_s, backward_s, optimizer_s = _built_split(base.timing, step_s, optimizer_s)
        timing = object.__new__(Timing)  # (frozen dataclasses: filled through their __dict__)
        timing.__dict__.update(
            step_s=step_s,
            forward_s=forward_s,
            backward_s=backward_s,
            optimizer_s=optimizer_s,
            samples_per_s=_opt(row[SAMPLES_PER_S]),
            tokens_per_s=_opt(row[TOKENS_PER_S]),
        )
        snap = object.__new__(Snapshot)
        fields = snap.__dict__
        fields.update(base.__dict__)
        fields["seq"], fields["time"], fields["step"] = seq, row[TIME], int(row[STEP])
        fields["timing"] = timing
        return snap

    def rows_since(self, cursor: int) -> tuple[StepRows, int]:
        """The rows written since ``cursor`` (a previous call's second value; 0 at first), and the cursor
        for the next call."""
        w = self.written
        first = max(cursor, w - CAPACITY + 1)  # (not the slot the next row goes to)
        values = array("d")
        i, stop = first & MASK, w & MASK
        if w > first:
            if i < stop:
                values = self.values[i * WIDTH : stop * WIDTH]
            else:  # the rows wrap around the ring's end
                values = self.values[i * WIDTH :] + self.values[: stop * WIDTH]
        # Rows the writer may have reused while they were copied: row j's slot is row j + CAPACITY's.
        torn = min(max(self.written - CAPACITY - first + 1, 0), w - first)
        if torn:
            values = values[torn * WIDTH :]
        return StepRows(values, w - first - torn, first - cursor + torn), w


class FeedHistory(Sequence[Snapshot]):
    """The last ``maxlen`` finished steps' snapshots, oldest first, made from the feed's rows when read
    (``tracker.history``). Read it on the training thread, between steps: the rows it shows are then
    still in the ring."""

    __slots__ = ("_feed", "maxlen")

    def __init__(self, feed: StepFeed, maxlen: int) -> None:
        self._feed = feed
        self.maxlen = min(int(maxlen), CAPACITY)

    def __len__(self) -> int:
        return min(self._feed.written, self.maxlen)

    @overload
    def __getitem__(self, index: int) -> Snapshot: ...
    @overload
    def __getitem__(self, index: slice) -> list[Snapshot]: ...
    def __getitem__(self, index: int | slice) -> Snapshot | list[Snapshot]:
        n = len(self)
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(n))]
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("history index out of range")
        snap = self._feed.snapshot(self._feed.written - n + i)
        if snap is None:  # (only a reader racing the training thread gets here)
            raise IndexError("the step has left the history")
        return snap

    def __iter__(self) -> Iterator[Snapshot]:
        feed = self._feed
        first = feed.written - len(self)
        for k in range(first, first + len(self)):
            snap = feed.snapshot(k)
            if snap is not None:
                yield snap

    def __repr__(self) -> str:
        return f"FeedHistory({list(self)!r}, maxlen={self.maxlen})"


__all__ = ["CAPACITY", "WIDTH", "FeedHistory", "StepFeed", "StepRows"]
