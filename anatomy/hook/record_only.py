"""The flight recorder without the publisher: its own daemon thread, for a process whose socket could not
be opened (the history is not lost with it) or that publishes nothing but asked for a record
(``track(..., publish=False, record=True | PATH)``).

The same hand-off as the publisher's: the training thread appends each finished step's snapshot to a
bounded deque (O(1), never blocks); the thread hands them to the recorder at the interval, an OOM at once,
and everything left with the end record on close (or at exit).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import threading
from collections import deque

from anatomy.protocol import Hello, Snapshot
from anatomy.recorder import Recorder

log = logging.getLogger("anatomy")


class RecordOnly:
    def __init__(self, hello: Hello, recorder: Recorder, interval_s: float) -> None:
        self.hello = hello
        self.recorder = recorder
        self.interval_s = max(float(interval_s), 0.05)
        # 4,096: as the publisher's (8,000 steps/s at 0.5 s; a thread held up longer loses the oldest).
        self._queue: deque[Snapshot] = deque(maxlen=4096)
        self._wake = threading.Event()
        self._closing = False
        self._closed = False
        self._owner = os.getpid()
        self._thread = threading.Thread(target=self._run, name="anatomy-recorder", daemon=True)

    def start(self) -> RecordOnly:
        self._thread.start()
        atexit.register(self.close)
        return self

    def publish(self, snapshot: Snapshot) -> None:
        self._queue.append(snapshot)

    def set_hello(self, hello: Hello) -> None:
        self.hello = hello

    def record_oom(self, snapshot: Snapshot) -> None:
        if snapshot.oom is None:
            snapshot = dataclasses.replace(snapshot, oom="out of memory")
        self._queue.append(snapshot)
        self._wake.set()

    def close(self) -> None:
        """The last steps and the end record, then the thread ends. Idempotent; nothing in a forked
        child (the thread and the record are the parent's)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if os.getpid() != self._owner:
            return
        self._closing = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        try:
            while not self._closing:
                self._wake.wait(self.interval_s)
                self._wake.clear()
                self._hand_over(final=False)
            self._hand_over(final=True)
        except Exception as exc:  # the recorder turns itself off on errors; a bug here must not spread
            log.warning("anatomy-top: recording stopped (%s); training goes on", exc)

    def _hand_over(self, final: bool) -> None:
        taken: list[Snapshot] = []
        while self._queue:
            taken.append(self._queue.popleft())
        if final:
            self.recorder.close(self.hello, taken)
        else:
            self.recorder.tick(self.hello, taken)
