"""The runtime directory that holds the hooks' sockets and OOM files: where it is, how it is created,
and when a reader may trust it. The one implementation the hook, the monitor and the exporter use.

Stdlib only, and cheap to import: the monitor's ``--once`` pre-check reads it before anything else.

Trust: whoever can create a file in the directory can plant a socket (a fake publisher) or a file (a FIFO,
a link to /dev/zero) in it. A reader therefore reads a directory only when it is a real directory (not a
symbolic link), owned by the user the reader expects (itself, or, for root, the user the directory
belongs to) and writable by that owner alone.
"""

from __future__ import annotations

import os
import stat

# Not ``typing`` or ``pathlib`` at import time (~15 ms): the monitor's --once pre-check imports this module.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

ENV_DIR = "ANATOMY_TOP_DIR"


def runtime_dir(create: bool = False) -> Path:
    """$ANATOMY_TOP_DIR, else $XDG_RUNTIME_DIR/anatomy-top, else <tempdir>/anatomy-top-<uid>.
    With ``create``, made private (0700, ours) first: see :func:`ensure_private_dir`."""
    from pathlib import Path

    explicit = os.environ.get(ENV_DIR)
    if explicit:
        path = Path(explicit)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "anatomy-top"
    else:
        import tempfile  # here: candidate_dirs' callers must not pay for it

        path = Path(tempfile.gettempdir()) / f"anatomy-top-{os.getuid()}"
    if create:
        ensure_private_dir(path)
    return path


def candidate_dirs() -> list[str]:
    """Every directory :func:`runtime_dir` could pick under any temporary-directory setting (a superset,
    without calling ``tempfile``: for a cheap "is anybody publishing?" look)."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return [explicit]
    out: list[str] = []
    if os.environ.get("XDG_RUNTIME_DIR"):
        out.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "anatomy-top"))
    temps = [os.environ.get(k) for k in ("TMPDIR", "TEMP", "TMP")] + ["/tmp", "/var/tmp", "/usr/tmp"]
    out += [os.path.join(t, f"anatomy-top-{os.getuid()}") for t in temps if t]
    return out


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` 0700 if missing; refuse one that is a link, not a directory or not ours (someone
    else made it first: they could read and plant files in it); tighten its mode to 0700."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{path} is not a directory owned by uid {os.getuid()}")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def untrusted_reason(path: Path, owner: int | None = None) -> str | None:
    """Why a reader must not read ``path`` (None: it may, or it does not exist). ``owner``: the uid the
    directory must belong to (default: this process's effective uid)."""
    owner = os.geteuid() if owner is None else owner
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot stat ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != owner:
        return f"{path} belongs to uid {st.st_uid}, not {owner}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None
