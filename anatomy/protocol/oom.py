"""The last-snapshot file a hook writes when its process dies of out-of-memory: written atomically,
read back without trusting whatever was planted under its name. Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from anatomy.protocol.bounds import MAX_MESSAGE_BYTES, ProtocolError
from anatomy.protocol.codec import decode, encode
from anatomy.protocol.discovery import oom_path
from anatomy.protocol.messages import Hello, Snapshot


def write_oom_file(directory: Path, hello: Hello, snapshot: Snapshot) -> Path:
    """Two lines, hello then the last snapshot (with ``oom`` set); written atomically, 0600. A failed
    write (a full disk) leaves nothing behind: no empty or partial file."""
    path = oom_path(directory, hello.pid)
    data = encode(hello) + encode(snapshot)  # before touching the disk: no half-written file
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(tmp.lstat().st_mode):
            raise FileExistsError(f"{tmp} exists and is not a regular file")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def read_small_file(path: Path | str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. Never follows a link, never blocks on a
    FIFO or device, never reads more than ``limit + 1`` bytes: whatever was planted under the name."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProtocolError(f"{path} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProtocolError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise ProtocolError(f"{path} is larger than {limit} bytes")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ProtocolError(f"{path} is larger than {limit} bytes")
    return data


def read_oom_file(path: Path | str) -> tuple[Hello, Snapshot]:
    """The hello and last snapshot a hook wrote when its process died of out-of-memory."""
    raw = read_small_file(path, 2 * MAX_MESSAGE_BYTES)
    lines = [ln for ln in raw.split(b"\n") if ln.strip()]
    if len(lines) != 2:
        raise ProtocolError(f"{path} must hold a hello and a snapshot")
    hello, snap = decode(lines[0]), decode(lines[1])
    if not isinstance(hello, Hello) or not isinstance(snap, Snapshot):
        raise ProtocolError(f"{path} does not hold a hello then a snapshot")
    return hello, snap
