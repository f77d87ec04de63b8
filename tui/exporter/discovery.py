"""Which runtime directories the exporter reads, and whose sockets it believes.

A hook publishes in a directory private to its user (``anatomy.protocol.runtime_dir``: 0700, owned by
that user), so whoever can create a socket there is that user (or root). The exporter reads:

- as an ordinary user: its own runtime directory and the ``--dir`` directories it owns;
- as root: every user's runtime directory it can find (``/run/user/<uid>/anatomy-top`` and
  ``<tmp>/anatomy-top-<uid>`` in the usual temporary directories), its own, and the ``--dir`` ones.

Every ``--dir`` is read together with its immediate subdirectories: one shared parent (a host path
mounted into each training container as ``ANATOMY_TOP_DIR=<parent>/<pod>``) covers a node. Such a parent
may be sticky and world-writable, like /tmp (``d /run/anatomy-top 1777``), so that non-root pods can
create their own subdirectory: then only its subdirectories are read.

A directory is trusted only if it is a real directory (not a link), writable by its owner alone, and
owned by the user its name says (``anatomy-top-1000`` by uid 1000: anyone can create that name in
/tmp first). A socket is believed only if it is owned by its directory's owner; as a non-root user only
directories (and so sockets) of that user are read. Stdlib only.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from anatomy import protocol
from anatomy.rundir import untrusted_reason

RUN_USER = Path("/run/user")
TEMP_DIRS: tuple[str, ...] = ("/tmp", "/var/tmp")
_TMP_NAME = re.compile(r"^anatomy-top-(\d+)$")
# Bounds the work of one scrape on a directory with thousands of subdirectories.
MAX_DIRS = 256


@dataclass(frozen=True)
class RuntimeDir:
    """A trusted directory and the uid every socket in it must belong to."""

    path: Path
    owner: int


@dataclass(frozen=True)
class Rejected:
    path: Path
    reason: str


def _expected_owner(path: Path) -> int | None:
    """The uid a directory's name promises: ``anatomy-top-<uid>``, ``/run/user/<uid>/anatomy-top``."""
    m = _TMP_NAME.match(path.name)
    if m:
        return int(m.group(1))
    if path.name == "anatomy-top" and path.parent.parent == RUN_USER and path.parent.name.isdigit():
        return int(path.parent.name)
    return None


def check_dir(path: Path, euid: int) -> RuntimeDir | Rejected | None:
    """Whether ``path`` may be read by an exporter running as ``euid`` (None: it does not exist). The
    generic rules are the monitor's (``anatomy.rundir.untrusted_reason``); the name's uid and root's
    reach are the exporter's."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Rejected(path, f"cannot stat: {exc.strerror or exc}")
    expected = _expected_owner(path)
    if expected is not None and st.st_uid != expected and not stat.S_ISLNK(st.st_mode):
        return Rejected(path, f"is owned by uid {st.st_uid}, its name says uid {expected}")
    if euid != 0 and st.st_uid != euid and not stat.S_ISLNK(st.st_mode):
        return Rejected(path, f"belongs to uid {st.st_uid}: only root reads other users' sockets")
    reason = untrusted_reason(path, owner=st.st_uid)
    if reason is not None:
        return Rejected(path, reason.removeprefix(f"{path} "))
    return RuntimeDir(path, st.st_uid)


def _subdirs(path: Path) -> list[Path]:
    try:
        with os.scandir(path) as entries:
            return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def _every_users_dirs() -> list[Path]:
    found: list[Path] = []
    try:
        with os.scandir(RUN_USER) as entries:
            found += [Path(e.path) / "anatomy-top" for e in entries if e.name.isdigit()]
    except OSError:
        pass
    temps = dict.fromkeys([tempfile.gettempdir(), *TEMP_DIRS])
    for temp in temps:
        try:
            with os.scandir(temp) as entries:
                found += [Path(e.path) for e in entries if _TMP_NAME.match(e.name)]
        except OSError:
            continue
    return sorted(found)


def candidates(extra: Sequence[Path], euid: int, every_user: bool | None = None) -> list[Path]:
    """Every directory worth checking, in a stable order, without duplicates. ``every_user``: every
    user's runtime directories too (None: when ``euid`` is root's)."""
    paths: list[Path] = [protocol.runtime_dir()]
    for directory in extra:
        paths.append(directory)
        paths += _subdirs(directory)
    if (euid == 0) if every_user is None else every_user:
        paths += _every_users_dirs()
    unique: dict[str, Path] = {}
    for path in paths:
        unique.setdefault(os.path.normpath(os.path.abspath(path)), path)
    return list(unique.values())


def shared_parent(path: Path) -> bool:
    """A sticky, world-writable directory (like /tmp): a place where each user's private subdirectory
    lives, not one to read sockets from. Not worth a warning: its subdirectories are checked one by one."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX) and bool(st.st_mode & stat.S_IWOTH)


def runtime_dirs(
    extra: Sequence[Path] = (), euid: int | None = None, every_user: bool | None = None
) -> tuple[list[RuntimeDir], list[Rejected]]:
    """The trusted directories to read now, and those refused (with why); ``every_user`` as for
    :func:`candidates`."""
    euid = os.geteuid() if euid is None else euid
    parents = {os.path.normpath(os.path.abspath(p)) for p in extra}
    trusted: list[RuntimeDir] = []
    rejected: list[Rejected] = []
    for path in candidates(extra, euid, every_user):
        verdict = check_dir(path, euid)
        if isinstance(verdict, RuntimeDir):
            if len(trusted) < MAX_DIRS:
                trusted.append(verdict)
        elif verdict is not None:
            if os.path.normpath(os.path.abspath(path)) in parents and shared_parent(path):
                continue
            rejected.append(verdict)
    return trusted, rejected


def socket_owned_by(path: Path | None, owner: int) -> bool:
    """Whether the socket (or OOM file) at ``path`` belongs to ``owner`` (false when it is gone)."""
    if path is None:
        return False
    try:
        return path.lstat().st_uid == owner
    except OSError:
        return False


def explicit_dirs(values: Iterable[str]) -> list[Path]:
    return [Path(v).expanduser() for v in values]
