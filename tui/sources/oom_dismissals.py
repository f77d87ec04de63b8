"""Dismissed OOM records: a marker file beside the record holds the record's mtime_ns, so every monitor
of this user honours a dismissal, now and later, and a new OOM file (another mtime) shows again.

Stdlib only (plus anatomy.protocol's file helpers).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from anatomy import protocol
from anatomy.protocol import ProtocolError

DISMISSED_SUFFIX = ".dismissed"  # beside an OOM record: its mtime_ns, when a user dismissed it


def marker_path(oom_file: Path) -> Path:
    return oom_file.with_name(oom_file.name + DISMISSED_SUFFIX)


def read_marker(oom_file: Path) -> int | None:
    try:
        text = protocol.read_small_file(marker_path(oom_file), 64)
    except (OSError, ProtocolError):
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def write_marker(oom_file: Path, mtime_ns: int) -> None:
    """Atomically, never through a link (the directory is ours: checked before every poll)."""
    marker = marker_path(oom_file)
    tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{mtime_ns}\n")
        os.replace(tmp, marker)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def remove_orphan_markers(directory: Path) -> None:
    """A marker whose OOM record is gone has nothing left to hide."""
    try:
        with os.scandir(directory) as entries:
            names = {e.name for e in entries}
    except OSError:
        return
    for name in names:
        if (
            name.endswith(protocol.OOM_SUFFIX + DISMISSED_SUFFIX)
            and name[: -len(DISMISSED_SUFFIX)] not in names
        ):
            with contextlib.suppress(OSError):
                (directory / name).unlink()
