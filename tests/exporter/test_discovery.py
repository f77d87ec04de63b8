"""Which runtime directories the exporter reads: its own user's, every user's as root, never one that
someone else could have planted sockets in."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tui.exporter import discovery
from tui.exporter.discovery import Rejected, RuntimeDir, check_dir, runtime_dirs

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="creating other users' directories needs root")


def _dir(path: Path, mode: int = 0o700, uid: int | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def test_own_private_directory_is_trusted(tmp_path: Path) -> None:
    d = _dir(tmp_path / "rt")
    assert check_dir(d, os.geteuid()) == RuntimeDir(d, os.geteuid())


def test_missing_directory_is_not_an_error(tmp_path: Path) -> None:
    assert check_dir(tmp_path / "absent", os.geteuid()) is None


@pytest.mark.parametrize("mode", [0o720, 0o702, 0o777])
def test_directory_writable_by_others_is_refused(tmp_path: Path, mode: int) -> None:
    verdict = check_dir(_dir(tmp_path / "rt", mode), os.geteuid())
    assert isinstance(verdict, Rejected) and "writable by others" in verdict.reason


def test_symbolic_link_is_refused(tmp_path: Path) -> None:
    real = _dir(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(real)
    verdict = check_dir(link, os.geteuid())
    assert isinstance(verdict, Rejected) and "link" in verdict.reason


def test_an_ordinary_user_reads_only_its_own_directories(tmp_path: Path) -> None:
    d = _dir(tmp_path / "rt")
    other_user = os.geteuid() + 1000
    verdict = check_dir(d, other_user)
    assert isinstance(verdict, Rejected) and "only root" in verdict.reason


@needs_root
def test_a_name_claiming_another_uid_is_refused(tmp_path: Path) -> None:
    # Anyone can create /tmp/anatomy-top-1000 before uid 1000 does and plant sockets in it.
    squatted = _dir(tmp_path / "anatomy-top-1000", uid=4242)
    verdict = check_dir(squatted, 0)
    assert isinstance(verdict, Rejected) and "name says uid 1000" in verdict.reason
    honest = _dir(tmp_path / "anatomy-top-4243", uid=4243)
    assert check_dir(honest, 0) == RuntimeDir(honest, 4243)


@needs_root
def test_root_finds_every_users_runtime_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_user, tmp = tmp_path / "run-user", tmp_path / "tmp"
    monkeypatch.setattr(discovery, "RUN_USER", run_user)
    monkeypatch.setattr(discovery, "TEMP_DIRS", (str(tmp),))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # not this machine's /tmp: other runs use it
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(_dir(tmp_path / "roots-own")))
    xdg = _dir(run_user / "4244" / "anatomy-top", uid=4244)
    legacy = _dir(tmp / "anatomy-top-4245", uid=4245)
    squatted = _dir(tmp / "anatomy-top-4246", uid=4245)
    _dir(tmp / "unrelated", uid=4245)
    trusted, rejected = runtime_dirs([], euid=0)
    assert {d.path: d.owner for d in trusted} == {tmp_path / "roots-own": 0, xdg: 4244, legacy: 4245}
    assert [r.path for r in rejected] == [squatted]
    # The same machine seen by uid 4244: its own directory only (root's is not its to read).
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(xdg))
    trusted, _ = runtime_dirs([], euid=4244)
    assert [d.path for d in trusted] == [xdg]


def test_explicit_dirs_cover_their_subdirectories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(tmp_path / "absent"))
    parent = _dir(tmp_path / "shared", 0o755)
    pods = [_dir(parent / "pod-a"), _dir(parent / "pod-b")]
    (parent / "pod-c").symlink_to(pods[0])  # a link to a directory is not followed
    # every_user=False: this machine's other users are not the test's
    trusted, rejected = runtime_dirs([parent], euid=os.geteuid(), every_user=False)
    assert [d.path for d in trusted] == [parent, *pods]
    assert rejected == []


def test_a_sticky_shared_parent_is_not_read_but_its_private_subdirectories_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(tmp_path / "absent"))
    parent = _dir(tmp_path / "shared", 0o1777)  # like /tmp: anyone creates, nobody removes another's
    pod = _dir(parent / "pod-a")
    loose = _dir(parent / "pod-b", 0o777)
    trusted, rejected = runtime_dirs([parent], euid=os.geteuid(), every_user=False)
    assert [d.path for d in trusted] == [pod]
    assert [r.path for r in rejected] == [loose], "no warning for the sticky parent itself"
    # Without the sticky bit, a world-writable parent is refused like any other.
    os.chmod(parent, 0o777)
    _, rejected = runtime_dirs([parent], euid=os.geteuid(), every_user=False)
    assert [r.path for r in rejected] == [parent, loose]


def test_socket_owner_check(tmp_path: Path) -> None:
    f = tmp_path / "anatomy-1.sock"
    f.write_bytes(b"")
    assert discovery.socket_owned_by(f, os.geteuid())
    assert not discovery.socket_owned_by(f, os.geteuid() + 1)
    assert not discovery.socket_owned_by(tmp_path / "gone.sock", os.geteuid())
    assert not discovery.socket_owned_by(None, os.geteuid())
