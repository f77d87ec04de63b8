"""The hook's publisher: one Unix domain socket per training process, served by a daemon thread.

Stdlib only. The training thread only ever calls ``publish()``, which stores a reference (an atomic
assignment under the GIL) — or nothing at all per step: a publisher that ``follow``s a source (the hook's
step feed) takes the newest snapshot from it on its own thread, when it sends. Encoding and all socket
I/O happen on the server thread. Each reader gets
the hello and the latest snapshot on connect, then at most one snapshot per ``interval_s``, latest
only. Per reader at most two encoded messages are held: the one being written and the newest one
waiting behind it, so a stuck reader costs bounded memory and never slows training.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import select
import selectors
import socket
import threading
import time
import weakref
from collections import deque
from pathlib import Path

from anatomy.protocol import socket_file
from anatomy.protocol.codec import encode
from anatomy.protocol.discovery import FileIdentity, discover, runtime_dir
from anatomy.protocol.hand_off import LatestSource, StepRecorder
from anatomy.protocol.messages import Busy, Hello, Snapshot
from anatomy.protocol.oom import write_oom_file
from anatomy.protocol.reader_queue import ReaderQueue
from anatomy.rundir import ensure_private_dir

log = logging.getLogger("anatomy")

MAX_READERS = 64
# Readers send nothing; what they send anyway is read and dropped, up to this much per connection.
MAX_INBOUND_BYTES = 64 * 1024
_SEND_FLAGS = getattr(socket, "MSG_NOSIGNAL", 0)
_IDLE_WAIT_S = 5.0

# Publishers alive in this process, for the fork handler (a weak set: a closed publisher may go).
_LIVE: weakref.WeakSet[Publisher] = weakref.WeakSet()


class Publisher:
    """Serves ``hello`` and the latest ``Snapshot`` to any number of anatomy-top monitors.

    Never raises to the caller: a failure to start returns None from ``start()`` and logs one line.
    """

    def __init__(
        self,
        hello: Hello,
        interval_s: float = 0.5,
        directory: Path | None = None,
        recorder: StepRecorder | None = None,
    ) -> None:
        self.hello = hello
        # The flight recorder (anatomy.recorder), fed from this thread; publish() only appends to a
        # bounded deque (O(1), thread-safe), so every finished step reaches the record. Drained every
        # interval: 4,096 covers 8,000 steps/s at 0.5 s; a thread held up longer loses the oldest rows
        # (never memory: at most a few MiB of snapshots wait here).
        self.recorder = recorder
        self._to_record: deque[Snapshot] | None = deque(maxlen=4096) if recorder is not None else None
        self._recorded_at = 0.0
        self.interval_s = max(0.0, float(interval_s))
        self._directory = Path(directory) if directory is not None else None
        self._owner_pid = os.getpid()
        self._path: Path | None = None
        self._bound: FileIdentity | None = None  # of the socket we bound
        self._latest: Snapshot | None = None
        self._source: LatestSource | None = None  # followed: the newest snapshot is taken from it
        self._pulled = 0  # the source's ``written`` when its newest snapshot was last taken
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._thread: threading.Thread | None = None
        self._readers: dict[int, ReaderQueue] = {}
        self._reader_count = 0
        self._closing = False
        self._closed = False
        self._forked = False
        self._logged: set[str] = set()
        self._hello_bytes = b""
        self._hello_obj: Hello | None = None  # the hello _hello_bytes encodes
        self._sent_obj: Snapshot | None = None  # the snapshot last broadcast (or skipped as unencodable)
        self._sent_bytes: bytes | None = None
        self._last_send = 0.0
        self.messages_sent = 0  # snapshots handed to readers (for tests and benchmarks)
        self.readers_dropped = 0

    # -- public API -------------------------------------------------------------------------

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def reader_count(self) -> int:
        return self._reader_count

    @property
    def directory(self) -> Path | None:
        return self._directory

    @property
    def last_taken(self) -> Snapshot | None:
        """The snapshot the server thread last took up: broadcast, or skipped as unencodable."""
        return self._sent_obj

    def start(self) -> Path | None:
        """Bind the socket and start serving; the socket's path, or None if it could not start."""
        if self._thread is not None:
            return self._path
        if self._closed or self._forked:
            return None
        self._owner_pid = os.getpid()  # the process that serves (and may unlink) the socket
        try:
            self._hello_bytes = encode(self.hello)
            self._hello_obj = self.hello
            directory = self._prepare_directory()
            discover(directory, clean_stale=True)
            path = self._path = socket_file.claim_path(directory)
            self._listener, self._bound = socket_file.listen(path)
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
            self._selector = selectors.DefaultSelector()
            assert self._listener is not None
            self._selector.register(self._listener, selectors.EVENT_READ, None)
            self._selector.register(self._wake_r, selectors.EVENT_READ, None)
            self._thread = threading.Thread(target=self._serve, name="anatomy-publisher", daemon=True)
            self._thread.start()
        except Exception as exc:  # never raise into the training script
            self._log_once(
                "start", "anatomy-top: publisher could not start (%s); the hook runs unpublished", exc
            )
            self._release()
            self._path = None
            return None
        _LIVE.add(self)
        atexit.register(self.close)
        return self._path

    def follow(self, source: LatestSource) -> None:
        """Take the latest snapshot from ``source`` from now on, on the server thread when it is about to
        be sent (``publish`` still makes one the latest until the source's next step)."""
        self._source = source

    def _pull(self) -> Snapshot | None:
        """The latest snapshot: the followed source's newest step, if it has finished one since."""
        source = self._source
        if source is not None:
            written = source.written
            if written != self._pulled:
                snap = source.latest()
                self._pulled = written
                if snap is not None:
                    self._latest = snap
        return self._latest

    def publish(self, snapshot: Snapshot) -> None:
        """Make ``snapshot`` the latest; the server thread sends it at its next tick. O(1)."""
        self._latest = snapshot
        if self._to_record is not None:
            self._to_record.append(snapshot)

    def set_hello(self, hello: Hello) -> None:
        """Replace the hello (the set-up changed: an optimizer attached, the precision learnt). O(1);
        connected readers get the new hello at the next tick, before any later snapshot."""
        self.hello = hello

    def write_oom(self, snapshot: Snapshot) -> Path | None:
        """Write the hello and ``snapshot`` (``oom`` set) to ``<dir>/anatomy-<pid>.oom.json``."""
        try:
            directory = self._directory if self._directory is not None else runtime_dir(create=True)
            if snapshot.oom is None:
                snapshot = dataclasses.replace(snapshot, oom="out of memory")
            if self._to_record is not None:  # recorded by the server thread, woken now
                self._to_record.append(snapshot)
                if self._wake_w is not None:
                    with contextlib.suppress(OSError):
                        self._wake_w.send(b"r", _SEND_FLAGS)
            return write_oom_file(directory, self.hello, snapshot)
        except Exception as exc:
            self._log_once("oom", "anatomy-top: could not write the out-of-memory snapshot (%s)", exc)
            return None

    def close(self) -> None:
        """Stop serving and remove the socket. Idempotent; a forked child never touches the parent's."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        if os.getpid() != self._owner_pid or self._forked:
            self._drop_inherited()
            return
        self._closing = True
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x", _SEND_FLAGS)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
        self._release()

    def __enter__(self) -> Publisher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- setup ------------------------------------------------------------------------------

    def _prepare_directory(self) -> Path:
        if self._directory is None:
            self._directory = runtime_dir(create=True)
            return self._directory
        return ensure_private_dir(self._directory)

    # -- the server thread ------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            self._loop()
            self._final_flush()
        except Exception as exc:  # a bug here must not take the training process down
            self._log_once("serve", "anatomy-top: publisher stopped (%s)", exc)
        finally:
            for reader in list(self._readers.values()):
                self._drop(reader)

    def _loop(self) -> None:
        selector = self._selector
        assert selector is not None
        while not self._closing:
            now = time.monotonic()
            latest = self._pull()
            if latest is not None and latest is not self._sent_obj and self._readers:
                wait = max(0.0, self._last_send + self.interval_s - now)
            elif self._readers:
                # No wake-up from publish() (it must stay a bare assignment): poll at the interval.
                wait = self.interval_s if self.interval_s > 0 else 0.05
            else:
                wait = _IDLE_WAIT_S
            if self._to_record is not None:  # the recorder takes every step at the interval
                wait = min(wait, max(self.interval_s, 0.05))
            for key, events in selector.select(timeout=wait):
                if self._closing:
                    return
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(64)
                else:
                    reader: ReaderQueue = key.data
                    if events & selectors.EVENT_READ:
                        self._read(reader)
                    if events & selectors.EVENT_WRITE and reader.sock.fileno() in self._readers:
                        self._write(reader)
            self._refresh_hello()
            if time.monotonic() - self._last_send >= self.interval_s:
                self._send_latest()
            self._record()

    def _refresh_hello(self) -> None:
        hello = self.hello
        if hello is self._hello_obj:
            return
        self._hello_obj = hello
        try:
            data = encode(hello)
        except Exception as exc:
            self._log_once("hello", "anatomy-top: a new hello could not be encoded (%s)", exc)
            return
        self._hello_bytes = data
        for reader in list(self._readers.values()):
            reader.queue_hello(data)
            self._write(reader)

    def _send_latest(self) -> None:
        latest = self._pull()
        if latest is None or latest is self._sent_obj:
            return
        data = self._encode(latest)
        self._sent_obj = latest  # an unencodable snapshot is skipped, not retried
        if data is not None:
            self._sent_bytes = data
            self._last_send = time.monotonic()
            self._broadcast(data, latest)

    def _final_flush(self, budget_s: float = 0.25) -> None:
        """On close: the last snapshot (a tracker publishes one as it closes) goes out regardless of
        the interval, and readers get a short, bounded chance to take what is queued for them."""
        self._refresh_hello()
        self._send_latest()
        self._record(final=True)
        deadline = time.monotonic() + budget_s
        while (busy := [r for r in self._readers.values() if r.busy]) and time.monotonic() < deadline:
            try:
                _, writable, _ = select.select([], [r.sock for r in busy], [], deadline - time.monotonic())
            except (OSError, ValueError):
                return
            for sock in writable:
                reader = self._readers.get(sock.fileno())
                if reader is not None:
                    self._write(reader)

    def _record(self, final: bool = False) -> None:
        """Hand the steps finished since the last call to the recorder (at most once per interval,
        at once for an OOM; on close, everything and the end record)."""
        recorder, queue = self.recorder, self._to_record
        if recorder is None or queue is None:
            return
        now = time.monotonic()
        oom = bool(queue) and queue[-1].oom is not None
        if not final and not oom and now - self._recorded_at < self.interval_s:
            return
        self._recorded_at = now
        taken: list[Snapshot] = []
        while queue:
            taken.append(queue.popleft())
        if final:
            recorder.close(self.hello, taken)
        else:
            recorder.tick(self.hello, taken)

    def _encode(self, snapshot: Snapshot) -> bytes | None:
        try:
            return encode(snapshot)
        except Exception as exc:
            self._log_once("encode", "anatomy-top: a snapshot could not be encoded (%s)", exc)
            return None

    def _accept(self) -> None:
        assert self._listener is not None and self._selector is not None
        self._refresh_hello()
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._log_once("accept", "anatomy-top: accept failed (%s)", exc)
                return
            if len(self._readers) >= MAX_READERS:
                # Say why before hanging up, so that monitor shows "busy", not "exited". One small write
                # into a fresh socket's empty buffer: never blocks.
                with contextlib.suppress(OSError):
                    sock.setblocking(False)
                    sock.send(self._busy_line(), _SEND_FLAGS)
                sock.close()
                continue
            sock.setblocking(False)
            # The newest snapshot at connect time, even if its interval tick has not come yet.
            latest = self._pull()
            snap, snap_obj = self._sent_bytes, self._sent_obj
            if latest is not None and latest is not snap_obj:
                encoded = self._encode(latest)
                if encoded is not None:
                    snap, snap_obj = encoded, latest
            reader = ReaderQueue(sock, self._hello_bytes + (snap or b""), snap_obj if snap else None)
            self._readers[sock.fileno()] = reader
            self._reader_count = len(self._readers)
            self._selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, reader)
            self._write(reader)

    def _busy_line(self) -> bytes:
        busy = Busy(readers=len(self._readers), limit=MAX_READERS)
        return encode(busy, validate=False)

    def _read(self, reader: ReaderQueue) -> None:
        try:
            chunk = reader.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(reader)
            return
        if not chunk:  # the reader hung up
            self._drop(reader)
            return
        reader.inbound += len(chunk)
        if reader.inbound > MAX_INBOUND_BYTES:
            self._drop(reader)

    def _write(self, reader: ReaderQueue) -> None:
        while reader.busy:
            try:
                n = reader.sock.send(memoryview(reader.current)[reader.offset :], _SEND_FLAGS)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # EPIPE, ECONNRESET: the reader died
                self._drop(reader)
                return
            reader.offset += n
            if not reader.busy:
                self.messages_sent += 1
                reader.advance()
        self._set_interest(reader)

    def _broadcast(self, data: bytes, snapshot: Snapshot) -> None:
        for reader in list(self._readers.values()):
            if reader.sent is not snapshot:
                reader.queue(data, snapshot)
                self._write(reader)

    def _set_interest(self, reader: ReaderQueue) -> None:
        if reader.sock.fileno() not in self._readers or self._selector is None:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if reader.busy else 0)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.modify(reader.sock, events, reader)

    def _drop(self, reader: ReaderQueue) -> None:
        fd = reader.sock.fileno()
        if fd >= 0 and self._readers.pop(fd, None) is not None:
            self.readers_dropped += 1
            if self._selector is not None:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._selector.unregister(reader.sock)
        with contextlib.suppress(OSError):
            reader.sock.close()
        self._reader_count = len(self._readers)

    def buffered_bytes(self) -> int:
        """Bytes held for readers right now (bounded: at most two messages per reader)."""
        return sum(r.buffered for r in list(self._readers.values()))

    # -- teardown ---------------------------------------------------------------------------

    def _release(self) -> None:
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        if self._selector is not None:
            with contextlib.suppress(Exception):
                self._selector.close()
        self._listener = self._wake_r = self._wake_w = None
        self._selector = None
        path = self._path
        if path is not None:
            socket_file.remove_if_ours(path, self._bound)
            socket_file.release_path(path)
        self._reader_count = 0

    def _drop_inherited(self) -> None:
        """In a forked child: close our copies of the parent's sockets (so a reader the parent drops
        sees EOF), never unlink the parent's socket file, never serve."""
        self._forked = True
        self._closing = True
        socks = [self._listener, self._wake_r, self._wake_w, *(r.sock for r in self._readers.values())]
        for sock in socks:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        if self._selector is not None:
            with contextlib.suppress(Exception):
                self._selector.close()
        self._readers = {}
        self._listener = self._wake_r = self._wake_w = None
        self._selector = None
        self._thread = None
        self._reader_count = 0

    def _log_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)


def _after_fork_in_child() -> None:
    socket_file.forget_after_fork()
    for publisher in list(_LIVE):
        with contextlib.suppress(Exception):
            publisher._drop_inherited()
            publisher._closed = True
            atexit.unregister(publisher.close)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
