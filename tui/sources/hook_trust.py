"""Whether a hook's socket is to be believed: who serves it, and whether its hello tells the truth about
its PID. The anatomy source reads nothing from a socket these checks refuse.

Stdlib only (plus anatomy.protocol's reader).
"""

from __future__ import annotations

import os

from anatomy.protocol import Reader


def foreign_server(reader: Reader, owner: int) -> str | None:
    """Why a socket's server is not to be believed: it runs as another user than the directory's."""
    peer = reader.peer
    if peer is None or peer.uid in (owner, 0):
        return None
    return f"refused: {reader.path.name} is served by uid {peer.uid}, not the directory's uid {owner}"


def impersonation(reader: Reader) -> str | None:
    """A hello that claims another process than the one the kernel says serves the socket: refused when
    both live in our PID namespace (a lie); accepted across namespaces (a hook in a container numbers
    itself differently; the kernel's PID is then the one we use)."""
    peer, hello = reader.peer, reader.hello
    if peer is None or hello is None or peer.pid <= 0 or hello.pid == peer.pid:
        return None
    if not _same_pid_namespace(peer.pid):
        return None
    return (
        f"refused: the hello claims PID {hello.pid}, but the kernel says PID {peer.pid} serves "
        f"{reader.path.name}"
    )


def _same_pid_namespace(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError:
        return True  # cannot tell: be strict
