"""Where the wire's files live and what their names say: socket and OOM-file names, the PID a name
carries, which sockets belong to live training processes, and how to tell one file at a path from the
next. Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
from pathlib import Path

# The hook and the monitor name the runtime directory through this package.
from anatomy.rundir import runtime_dir as runtime_dir
from anatomy.rundir import untrusted_reason as untrusted_reason

SOCKET_SUFFIX = ".sock"
OOM_SUFFIX = ".oom.json"
_NAME_RE = re.compile(r"^anatomy-(\d+)(?:-([A-Za-z0-9_.]+))?$")


def socket_name(pid: int, tag: str | None = None) -> str:
    """``anatomy-<pid>[-<tag>].sock``: the PID is recoverable from the name alone."""
    return f"anatomy-{pid}{'-' + tag if tag else ''}{SOCKET_SUFFIX}"


def pid_from_path(path: Path | str) -> int | None:
    name = Path(path).name
    for suffix in (SOCKET_SUFFIX, OOM_SUFFIX):
        if name.endswith(suffix):
            m = _NAME_RE.match(name[: -len(suffix)])
            return int(m.group(1)) if m else None
    return None


def oom_path(directory: Path, pid: int) -> Path:
    return directory / f"anatomy-{pid}{OOM_SUFFIX}"


def pid_alive(pid: int) -> bool:
    if pid <= 0:  # os.kill(0, ...) addresses our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listening(path: Path) -> bool:
    """Whether something accepts connections on the socket file (refused at once when nothing does)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.05)
    try:
        sock.connect(str(path))
        return True
    except (BlockingIOError, TimeoutError):
        return True  # a full backlog: someone is listening
    except OSError:
        return False
    finally:
        sock.close()


def discover(directory: Path | None = None, clean_stale: bool = True) -> list[Path]:
    """Sockets of live training processes, sorted by PID. Only sockets count (a file, FIFO or link with
    a socket's name is ignored). Sockets whose process is gone are removed when ``clean_stale`` (a hook
    killed with SIGKILL cannot remove its own), and only when they belong to this user. A socket whose
    PID is not ours to see but which still accepts connections (another PID namespace) is kept."""
    directory = directory if directory is not None else runtime_dir()
    found: list[tuple[int, Path]] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    euid = os.geteuid()
    for entry in entries:
        if not entry.name.endswith(SOCKET_SUFFIX):
            continue
        pid = pid_from_path(entry.name)
        if pid is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISSOCK(st.st_mode):
            continue
        path = Path(entry.path)
        if not pid_alive(pid):
            if _listening(path):  # a live hook in another PID namespace (a container sharing the dir)
                found.append((pid, path))
                continue
            if clean_stale and st.st_uid == euid:
                with contextlib.suppress(OSError):
                    path.unlink()
            continue
        found.append((pid, path))
    return [p for _, p in sorted(found)]


def discover_oom(directory: Path | None = None) -> list[Path]:
    """Last-snapshot files written by hooks whose process died of out-of-memory (names only: what is
    behind a name is checked when it is read)."""
    directory = directory if directory is not None else runtime_dir()
    try:
        return sorted(p for p in directory.iterdir() if p.name.endswith(OOM_SUFFIX))
    except OSError:
        return []


# Which file sits at a path: (device, inode, change time in ns).
FileIdentity = tuple[int, int, int]


def file_identity(path: Path) -> FileIdentity | None:
    """Which file is at ``path`` (the name itself, never a link's target), None when nothing is.

    Device and inode name a file only while it exists: once a socket is removed, the next file created
    may be given its inode number, and a publisher (about to remove "its" socket) or a monitor (deciding
    whether a socket is the one it dismissed) would take the newcomer for the old one. The change time
    tells them apart: a new file's is its creation, and nothing changes a socket's metadata after the
    publisher's chmod. Not for a file that grows (an append moves its change time)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns
