"""A publisher's outbox for one connected reader: bounded to the message being written and the newest
one waiting behind it. Stdlib only; used by :mod:`anatomy.protocol.publisher` on its server thread.
"""

from __future__ import annotations

import socket

from anatomy.protocol.messages import Snapshot


class ReaderQueue:
    """One connected reader's outbox: the message being written (and how far), and the newest one
    waiting behind it (latest only), so a stuck reader holds at most two messages."""

    __slots__ = ("current", "hello", "inbound", "next", "offset", "sent", "sock")

    def __init__(self, sock: socket.socket, first: bytes, sent: Snapshot | None) -> None:
        self.sock = sock
        self.current = first
        self.offset = 0
        self.next: bytes | None = None
        self.inbound = 0
        self.sent = sent  # the snapshot last queued for this reader: never queue it twice
        self.hello: bytes | None = None  # a replaced hello, sent before whatever comes next

    @property
    def busy(self) -> bool:
        return self.offset < len(self.current)

    def queue(self, data: bytes, snapshot: Snapshot) -> None:
        self.sent = snapshot
        if self.busy:
            self.next = data  # replaces an older waiting snapshot: latest only
        else:
            self.current, self.offset, self.next = data, 0, None
            self._prepend_hello()

    def queue_hello(self, data: bytes) -> None:
        self.hello = data  # replaces an older waiting hello
        if not self.busy:
            self.current, self.offset = b"", 0
            self._prepend_hello()

    def advance(self) -> bool:
        """The current message is out: move on to what waits. False when nothing does."""
        waiting = (self.hello or b"") + (self.next or b"")
        self.hello = self.next = None
        self.current, self.offset = waiting, 0
        return bool(waiting)

    def _prepend_hello(self) -> None:
        if self.hello is not None:
            self.current, self.hello = self.hello + self.current, None

    @property
    def buffered(self) -> int:
        waiting = (len(self.next) if self.next else 0) + (len(self.hello) if self.hello else 0)
        return len(self.current) - self.offset + waiting
