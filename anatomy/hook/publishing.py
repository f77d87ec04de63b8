"""The tracker's side of publishing: the socket opened on the first snapshot, a changed hello passed on at
once, the OOM file. Finished steps reach the publisher and the flight recorder through the step feed
(:class:`anatomy.step_feed.StepFeed`), which they read on their own thread: the training thread hands
them nothing per step.

The flight recorder rides on the publisher's thread. Where there is no publisher it runs on a thread of
its own (:mod:`anatomy.hook.record_only`): when the socket cannot be opened (the history is not lost
with it), and with ``publish=False`` when ``record=`` asks for a record in code (``publish=False``
alone records nothing, whatever ``ANATOMY_TOP_RECORD`` says)."""

from __future__ import annotations

from pathlib import Path

from anatomy import protocol
from anatomy.hook.guard import Feature, Guard
from anatomy.hook.record_only import RecordOnly
from anatomy.protocol import Hello, Snapshot
from anatomy.protocol.publisher import Publisher
from anatomy.recorder import Recorder, RecordSetting
from anatomy.step_feed import StepFeed


class Channel:
    def __init__(
        self,
        guard: Guard,
        *,
        enabled: bool,
        interval_s: float,
        directory: Path | None,
        record: RecordSetting = None,
        feed: StepFeed | None = None,
    ) -> None:
        self._guard = guard
        self._feed = feed if feed is not None else StepFeed()
        self._record = record
        self._publish = enabled
        self.enabled = enabled or (record is not None and record is not False)  # anything to do
        self._interval_s = interval_s
        self._directory = directory
        self.publisher: Publisher | None = None
        self._recorder: Recorder | None = None
        self._record_only: RecordOnly | None = None  # the recorder on its own thread, no publisher
        self._tried = False

    @property
    def path(self) -> Path | None:
        return self.publisher.path if self.publisher is not None else None

    def _ready(self, hello: Hello) -> Publisher | None:
        """The publisher, started on first use (once: a socket that cannot be opened is not retried)."""
        if self.publisher is not None or self._tried or not self.enabled:
            return self.publisher
        self._tried = True
        with self._guard(Feature.PUBLISH):
            # The flight recorder rides on the publisher's thread; here it is only configured (no disk).
            recorder = self._recorder = Recorder.from_setting(self._record, self._interval_s)
            if recorder is not None:
                recorder.follow(self._feed)
            if not self._publish:
                self._record_alone(hello, recorder)
                return None
            pub = Publisher(hello, interval_s=self._interval_s, directory=self._directory, recorder=recorder)
            pub.follow(self._feed)
            if pub.start() is None:
                self._guard.turn_off(Feature.PUBLISH, "the socket could not be opened")
                self._record_alone(hello, recorder)
                return None
            self.publisher = pub
        return self.publisher

    def _record_alone(self, hello: Hello, recorder: Recorder | None) -> None:
        if recorder is not None:
            self._record_only = RecordOnly(hello, recorder, self._interval_s).start()

    def publish(self, hello: Hello) -> None:
        """A step was built: start publishing (and recording) with the first one; from then on the
        publisher's thread takes every step from the feed itself."""
        if not self.enabled or self._tried or Feature.PUBLISH in self._guard.off:
            return
        self._ready(hello)

    def set_hello(self, hello: Hello) -> None:
        """The set-up changed: connected monitors get the new hello before the next snapshot."""
        if self.publisher is not None:
            with self._guard(Feature.PUBLISH):
                self.publisher.set_hello(hello)
        if self._record_only is not None:
            self._record_only.set_hello(hello)

    def write_oom(self, snap: Snapshot, hello: Hello) -> Path | None:
        """The snapshot (``oom`` set) to the OOM file, through the publisher when there is one, and to
        the record (publishing off: to the record alone)."""
        pub = self._ready(hello)
        if pub is not None:
            return pub.write_oom(snap)
        if self._record_only is not None:
            self._record_only.record_oom(snap)
        if not self._publish:
            return None
        directory = self._directory or protocol.runtime_dir(create=True)
        return protocol.write_oom_file(Path(directory), hello, snap)

    def crashed(self, exc: BaseException) -> None:
        """The tracker is closing on ``exc``: its record ends "crashed" (never raises)."""
        if self._recorder is not None:
            with self._guard(Feature.PUBLISH):
                self._recorder.crashed(exc)

    def close(self) -> None:
        pub, self.publisher = self.publisher, None
        if pub is not None:
            with self._guard(Feature.PUBLISH):
                pub.close()
        alone, self._record_only = self._record_only, None
        if alone is not None:
            with self._guard(Feature.PUBLISH):
                alone.close()
