"""One NVML read per scrape, timed to finish just before the scrape when Prometheus scrapes at a steady
interval.

A scrape that reads NVML itself waits for every call (each one tens of µs in the driver, more on a busy
node); nvitop-exporter reads every second in the background and serves the last result, ~200 calls a
second whether anyone scrapes or not. Here the read for the next scrape starts ``lead_s`` before it is
due — the shortest of the last few intervals after the last scrape — and the scrape takes that reading
if it is at most ``max_age_s`` old (else, and whenever scrapes are not steady, it reads at the scrape as
before). So NVML is still read once per scrape, never more, and the scrape does not wait for it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")

LEAD_S = 0.1  # how long before the expected scrape the read starts
MAX_AGE_S = 1.0  # a reading older than this at the scrape is not used (nvitop-exporter's default interval)
HISTORY = 4  # scrapes whose intervals must agree before reading ahead
# Intervals "agree" when the longest is within this of the shortest: a fraction of it, or seconds.
STEADY_FRACTION, STEADY_S = 0.25, 0.1


class ReadAhead(Generic[T]):
    """``take()`` at the start of a scrape: the reading made for it and its age, or None (read now);
    ``scraped(at)`` when a scrape began: plans the read for the next one."""

    def __init__(
        self,
        read: Callable[[], T],
        *,
        lead_s: float = LEAD_S,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self._lead_s = lead_s
        self._max_age_s = max_age_s
        self._clock = clock
        self._lock = threading.Lock()
        self._times: deque[float] = deque(maxlen=HISTORY)
        self._timer: threading.Timer | None = None
        self._future: Future[tuple[float, T]] | None = None
        self._token = 0  # a timer whose token is stale does nothing
        self._closed = False
        self.used = 0  # readings a scrape took
        self.stale = 0  # readings made but too old when the scrape came: wasted

    def take(self) -> tuple[T, float] | None:
        with self._lock:
            self._token += 1
            timer, self._timer = self._timer, None
            future, self._future = self._future, None
        if timer is not None:
            timer.cancel()  # not due yet: the scrape came early; it reads now
        if future is None:
            return None
        try:
            started, reading = future.result()  # in flight: as fresh as a read now, and sooner done
        except Exception:
            return None
        age = self._clock() - started
        if age > self._max_age_s:
            with self._lock:
                self.stale += 1
                self._times.clear()  # the interval changed: wait until it is steady again
            return None
        self.used += 1
        return reading, age

    def scraped(self, at: float) -> None:
        with self._lock:
            if self._closed:
                return
            self._times.append(at)
            if len(self._times) < HISTORY:
                return
            times = list(self._times)
            intervals = [b - a for a, b in itertools.pairwise(times)]
            shortest, longest = min(intervals), max(intervals)
            if shortest <= 0 or longest - shortest > max(STEADY_FRACTION * shortest, STEADY_S):
                return
            delay = at + shortest - min(self._lead_s, shortest / 4) - self._clock()
            if delay <= 0:
                return
            self._token += 1
            timer = self._timer = threading.Timer(delay, self._fire, args=(self._token,))
            timer.daemon = True
        timer.start()

    def _fire(self, token: int) -> None:
        with self._lock:
            if token != self._token or self._closed:
                return
            future = self._future = Future()
        started = self._clock()
        try:
            future.set_result((started, self._read()))
        except Exception as exc:  # the scrape reads for itself
            future.set_exception(exc)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._token += 1
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
