"""Which process, in the exporter's own PID namespace, serves a hook socket (Linux ``SO_PEERCRED``).

A hook in a container publishes the PID it sees (1, 7, ...), which means nothing on the node: NVML lists
the node's PIDs. The kernel knows better: the credentials of a Unix socket's server, read by a client,
come translated into the client's PID namespace. So an exporter on the node (hostPID in Kubernetes)
learns each hook's node PID, and with it the GPU the process uses and NVML's figure for it.

A listening socket's server never changes, so the answer is kept per socket file (path, inode, ctime)
for as long as that file exists. Stdlib only.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from pathlib import Path

_CRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _identity(path: Path) -> tuple[str, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return str(path), st.st_ino, st.st_ctime_ns


def read_peer_pid(path: Path, timeout_s: float = 0.05) -> int | None:
    """The PID of the process listening on ``path``, as this process's namespace numbers it (None where
    the platform has no SO_PEERCRED, the socket refuses, or the server is outside our namespace)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(path))
        pid, _, _ = _CRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _CRED.size))
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            sock.close()
    return pid if pid > 0 else None  # 0: the server lives in a namespace we cannot see into


class PeerPids:
    """``get(path)``: the node PID serving ``path``, asked of the kernel once per socket file."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, int, int], int | None] = {}

    def get(self, path: Path | None) -> int | None:
        if path is None:
            return None
        key = _identity(path)
        if key is None:
            return None
        if key not in self._known:
            self._known[key] = read_peer_pid(path)
        return self._known[key]

    def keep_only(self, paths: list[Path]) -> None:
        """Forget sockets that are gone (bounded memory on a node where jobs come and go)."""
        live = {str(p) for p in paths}
        self._known = {k: v for k, v in self._known.items() if k[0] in live}
