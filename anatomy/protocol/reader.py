"""The monitor's side of one hook socket: a non-blocking, bounded reader that keeps the latest
hello and snapshot, and who serves the socket in the kernel's words (peer credentials). Stdlib only.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from anatomy.protocol.bounds import MAX_MESSAGE_BYTES, ProtocolError
from anatomy.protocol.codec import decode
from anatomy.protocol.discovery import pid_from_path
from anatomy.protocol.messages import Busy, Hello, Message, Snapshot

# A reader's poll takes at most this much from one socket, so a flooding peer cannot stall a monitor:
# the rest waits for the next poll (only the latest snapshot matters anyway).
POLL_BUDGET_BYTES = 4 * MAX_MESSAGE_BYTES
POLL_BUDGET_S = 0.025


@dataclass(frozen=True)
class Peer:
    """Who serves a socket, in the kernel's words (``SO_PEERCRED``): its PID as this process's PID
    namespace numbers it (0 when the server lives where we cannot see), its uid and gid."""

    pid: int
    uid: int
    gid: int


_UCRED = struct.Struct("3i")


def peer_of(sock: socket.socket) -> Peer | None:
    """The credentials of a connected Unix socket's other end (None where the platform has none)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size))
    except OSError:
        return None
    return Peer(pid, uid, gid)


class Reader:
    """A client of one hook socket. Non-blocking after connect: ``poll()`` drains what arrived (at most
    POLL_BUDGET_BYTES per call) and keeps the latest snapshot. Raises ProtocolError on anything
    invalid (then close it). ``peer``: who serves the socket, from the kernel."""

    def __init__(self, path: Path | str, timeout: float = 1.0) -> None:
        self.path = Path(path)
        self.pid = pid_from_path(self.path)
        self.hello: Hello | None = None
        self.snapshot: Snapshot | None = None
        self.busy: Busy | None = None
        self.closed = False
        self._buf = bytearray()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._connect(timeout)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self.peer = peer_of(self._sock)

    def _connect(self, timeout: float) -> None:
        # A Unix socket whose listen backlog is full refuses a non-blocking connect with EAGAIN
        # instead of queueing it (many monitors connecting at once): retry until the timeout.
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._sock.connect(str(self.path))
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def fileno(self) -> int:
        return self._sock.fileno()

    def _messages(self) -> Iterator[Message]:
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > MAX_MESSAGE_BYTES:
                    raise ProtocolError(f"line longer than {MAX_MESSAGE_BYTES} bytes")
                return
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            yield decode(line)

    def poll(self, budget_bytes: int = POLL_BUDGET_BYTES, budget_s: float = POLL_BUDGET_S) -> bool:
        """Read what is available, up to ``budget_bytes`` and for about ``budget_s``. Returns True if
        anything new arrived; on EOF sets closed. What a peer sends beyond the budget between two polls
        is read on later polls. Lines already buffered are decoded first: after a ProtocolError the
        next poll goes on with the line after the bad one, and the buffer never outgrows one budget."""
        got = self._drain()
        taken = 0
        deadline = time.monotonic() + budget_s
        while not self.closed and taken < budget_bytes and time.monotonic() < deadline:
            try:
                chunk = self._sock.recv(min(65536, budget_bytes - taken))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.closed = True
                break
            if not chunk:
                self.closed = True
                break
            taken += len(chunk)
            self._buf += chunk
            got = self._drain() or got
        return got

    @property
    def pending(self) -> bool:
        """A whole line is buffered, not decoded yet (left by a ProtocolError)."""
        return b"\n" in self._buf

    def _drain(self) -> bool:
        got = False
        for msg in self._messages():
            got = True
            if isinstance(msg, Busy):
                self.busy = msg
            elif isinstance(msg, Hello):
                self.hello = msg
            elif self.hello is None:
                raise ProtocolError("snapshot before hello")
            else:
                self.snapshot = msg
        return got

    def wait(self, timeout: float = 5.0, need_snapshot: bool = True) -> None:
        """Block until a hello (and a snapshot, if asked) arrived; for tests and `--once`."""
        import select

        deadline = time.monotonic() + timeout
        while not self.closed:
            self.poll()
            if self.hello is not None and (self.snapshot is not None or not need_snapshot):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {'snapshot' if self.hello else 'hello'} from {self.path}")
            select.select([self._sock], [], [], min(left, 0.1))
        if self.hello is None or (need_snapshot and self.snapshot is None):
            raise ConnectionError(f"{self.path} closed before sending a snapshot")

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
