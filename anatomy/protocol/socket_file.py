"""A publisher's socket file: claiming a name no other publisher of this process holds, binding it
private, and removing it only while it is still the one we bound. Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
from pathlib import Path

from anatomy.protocol.discovery import FileIdentity, file_identity, socket_name

# Names held by publishers of this process (a second publisher takes the next name).
_TAKEN_PATHS: set[Path] = set()
_TAKEN_LOCK = threading.Lock()


def claim_path(directory: Path) -> Path:
    """``anatomy-<pid>.sock``; a second publisher in the same process gets ``anatomy-<pid>-<n>``."""
    pid = os.getpid()
    with _TAKEN_LOCK:
        n = 0
        while True:
            path = directory / socket_name(pid, str(n) if n else None)
            if path not in _TAKEN_PATHS and not _foreign_file(path):
                _TAKEN_PATHS.add(path)
                return path
            n += 1


def listen(path: Path) -> tuple[socket.socket, FileIdentity | None]:
    """A non-blocking listener bound at ``path`` (0600), and the identity of the socket file it made."""
    # A file with our name belongs to a dead process whose PID we reuse (we are alive and no
    # other publisher of ours holds the name): replace it.
    with contextlib.suppress(FileNotFoundError):
        st = path.lstat()
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            # Only a socket of ours is a dead hook's leftover: anything else is not ours to delete.
            raise FileExistsError(f"{path} exists and is not a socket of this user")
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound: FileIdentity | None = None
    try:
        listener.bind(str(path))
        # The directory is 0700, so nobody else can reach the socket before this chmod.
        os.chmod(path, 0o600)
        bound = file_identity(path)
        listener.listen(128)
        listener.setblocking(False)
    except Exception:
        listener.close()
        remove_if_ours(path, bound)
        raise
    return listener, bound


def remove_if_ours(path: Path, bound: FileIdentity | None) -> None:
    """Unlink ``path`` only if it is still the socket we bound: something else may have replaced it since
    (never ours to remove)."""
    if bound is not None and file_identity(path) == bound:
        with contextlib.suppress(OSError):
            path.unlink()


def release_path(path: Path) -> None:
    with _TAKEN_LOCK:
        _TAKEN_PATHS.discard(path)


def forget_after_fork() -> None:
    """In a forked child: the parent's names are not ours, and its lock may have been held at the fork."""
    global _TAKEN_LOCK
    _TAKEN_LOCK = threading.Lock()
    _TAKEN_PATHS.clear()


def _foreign_file(path: Path) -> bool:
    """Something at ``path`` that is not a socket of ours: not ours to replace, so take the next name."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid()
