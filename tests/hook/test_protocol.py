"""anatomy.protocol: messages, validation, the Reader's framing, runtime directory, OOM files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from anatomy import protocol
from anatomy.protocol import (
    MAX_MESSAGE_BYTES,
    CudaMemory,
    Hello,
    OpGroupStat,
    ProtocolError,
    Reader,
    Snapshot,
    Suggestion,
    Timing,
)
from anatomy.vocabulary import Component, OpGroup, Phase


def make_hello(pid: int = 4242) -> Hello:
    return Hello(
        pid=pid,
        host="node-1",
        device="cuda:0",
        precision="bf16_mixed",
        optimizer="adamw",
        model_class="BertForSequenceClassification",
        parameter_count=11_000_000,
        torch_version="2.13.0",
        started_at=1_700_000_000.5,
        rank=0,
        local_rank=0,
        world_size=2,
        dtype="float32",
        optimizer_class="AdamW",
    )


def make_snapshot(seq: int = 7, pid: int = 4242) -> Snapshot:
    return Snapshot(
        pid=pid,
        seq=seq,
        time=1_700_000_100.25,
        step=seq * 10,
        memory={Component.WEIGHTS.value: 44_000_000, Component.TEMPORARIES.value: None},
        expected_bytes_per_param={Component.WEIGHTS.value: 6.0, Component.ACTIVATIONS.value: None},
        parameter_count=11_000_000,
        peak_bytes=300_000_000,
        peak_phase=Phase.BACKWARD.value,
        memory_source="cuda_allocator",
        cuda=CudaMemory(allocated=1, reserved=2, peak_allocated=3, alloc_retries=0, ooms=0),
        timing=Timing(step_s=0.25, forward_s=0.1, backward_s=0.12, optimizer_s=0.03, samples_per_s=32.0),
        op_groups={
            OpGroup.CONTRACTION.value: OpGroupStat(flops=1e12, time_s=0.1),
            OpGroup.OTHER.value: OpGroupStat(flops=None, time_s=None),
        },
        op_groups_step=50,
        achieved_tflops=12.5,
        mfu=0.4,
        grad_accum_steps=2,
        suggestions=[Suggestion("r", "Title [bold]", "detail", "guide", saving_bytes=10, speed_factor=1.5)],
        error=None,
    )


def test_hello_and_snapshot_round_trip_exactly() -> None:
    for msg in (make_hello(), make_snapshot()):
        line = protocol.encode(msg)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert protocol.decode(line.rstrip(b"\n")) == msg


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    d = protocol.to_dict(make_snapshot())
    d["a_field_from_the_future"] = {"x": 1}
    assert protocol.decode(json.dumps(d).encode()) == make_snapshot()


def test_version_mismatch_is_rejected() -> None:
    d = protocol.to_dict(make_hello())
    d["protocol"] = protocol.PROTOCOL_VERSION + 1
    with pytest.raises(ProtocolError, match="protocol version"):
        protocol.decode(json.dumps(d).encode())
    del d["protocol"]
    with pytest.raises(ProtocolError, match="missing protocol"):
        protocol.decode(json.dumps(d).encode())


def _snapshot_dict(**changes: object) -> dict[str, object]:
    d = protocol.to_dict(make_snapshot())
    d.update(changes)
    return d


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # nesting deep enough to blow the recursion limit
        (b'{"protocol": 1, "type": "hello", "pid": ' + b"9" * 5000 + b"}", "not JSON"),  # int digit limit
        (json.dumps({"protocol": 1, "type": "gossip"}).encode(), "unknown message type"),
        (json.dumps(_snapshot_dict(pid="12")).encode(), "'pid'"),
        (json.dumps(_snapshot_dict(seq=-1)).encode(), "negative"),
        (json.dumps(_snapshot_dict(step=True)).encode(), "bool"),
        (json.dumps(_snapshot_dict(mfu="high")).encode(), "'mfu'"),
        (json.dumps(_snapshot_dict(memory={"gpu_ghosts": 1})).encode(), "unknown keys"),
        (json.dumps(_snapshot_dict(op_groups={"tensor_contractions": 3})).encode(), "not an object"),
        (json.dumps(_snapshot_dict(peak_phase="lunch")).encode(), "peak_phase"),
        (json.dumps(_snapshot_dict(error="x" * 5000)).encode(), "too long"),
        (json.dumps(_snapshot_dict(suggestions=[{}] * 65)).encode(), "too many"),
        (json.dumps(_snapshot_dict(time=float("nan"))).encode(), "not finite"),  # json writes NaN
    ],
)
def test_malformed_messages_raise_a_clear_protocol_error(payload: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        protocol.decode(payload)


def test_missing_required_field_is_named() -> None:
    d = protocol.to_dict(make_hello())
    del d["torch_version"]
    with pytest.raises(ProtocolError, match="missing field 'torch_version'"):
        protocol.decode(json.dumps(d).encode())


def test_oversize_messages_are_rejected_both_ways() -> None:
    huge = Snapshot(**{**make_snapshot().__dict__, "error": None})
    huge = Snapshot(
        **{
            **huge.__dict__,
            "suggestions": [Suggestion("r", "t", "d" * 4000, "guide") for _ in range(64)] * 2,
        }
    )
    with pytest.raises(ProtocolError, match="exceeds"):
        protocol.encode(huge)
    with pytest.raises(ProtocolError, match="exceeds"):
        protocol.decode(b" " * (MAX_MESSAGE_BYTES + 1))


def test_unencodable_values_raise_protocol_error_not_value_error_leaks() -> None:
    bad = Snapshot(**{**make_snapshot().__dict__, "mfu": float("nan")})
    with pytest.raises(ProtocolError, match="cannot be encoded"):
        protocol.encode(bad)


# -- Reader against a hand-written server -----------------------------------------------------------


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to ~108 bytes: pytest's tmp_path can be longer.
    d = Path(tempfile.mkdtemp(prefix="at-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _serve_bytes(path: Path, payload: bytes) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def run() -> None:
        conn, _ = server.accept()
        with contextlib.suppress(OSError):
            conn.sendall(payload)
        conn.close()
        server.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_reader_receives_hello_then_snapshot(short_dir: Path) -> None:
    path = short_dir / protocol.socket_name(4242)
    t = _serve_bytes(path, protocol.encode(make_hello()) + protocol.encode(make_snapshot()))
    with Reader(path) as r:
        r.wait(timeout=5)
        assert r.hello == make_hello() and r.snapshot == make_snapshot()
        assert r.pid == 4242
    t.join(5)


def test_reader_rejects_a_line_longer_than_the_limit(short_dir: Path) -> None:
    path = short_dir / protocol.socket_name(1)
    t = _serve_bytes(path, protocol.encode(make_hello()) + b"x" * (MAX_MESSAGE_BYTES + 10))
    with Reader(path) as r, pytest.raises(ProtocolError, match="longer than"):
        r.wait(timeout=5)
    t.join(5)


@pytest.mark.parametrize(
    ("second_line", "match"),
    [
        (b"{garbage\n", "not JSON"),
        (
            json.dumps({**protocol.to_dict(make_snapshot()), "protocol": 99}).encode() + b"\n",
            "protocol version",
        ),
        (
            json.dumps({**protocol.to_dict(make_snapshot()), "memory": {"ghosts": 1}}).encode() + b"\n",
            "unknown keys",
        ),
    ],
)
def test_reader_rejects_malformed_and_foreign_version_lines(
    short_dir: Path, second_line: bytes, match: str
) -> None:
    path = short_dir / protocol.socket_name(5)
    t = _serve_bytes(path, protocol.encode(make_hello()) + second_line)
    with Reader(path) as r, pytest.raises(ProtocolError, match=match):
        r.wait(timeout=5)
    t.join(5)


def test_reader_rejects_snapshot_before_hello(short_dir: Path) -> None:
    path = short_dir / protocol.socket_name(2)
    t = _serve_bytes(path, protocol.encode(make_snapshot()))
    with Reader(path) as r, pytest.raises(ProtocolError, match="before hello"):
        r.wait(timeout=5)
    t.join(5)


def test_reader_reports_a_peer_that_closes_early(short_dir: Path) -> None:
    path = short_dir / protocol.socket_name(3)
    t = _serve_bytes(path, protocol.encode(make_hello()))
    with Reader(path) as r, pytest.raises(ConnectionError):
        r.wait(timeout=5)
    assert r.closed
    t.join(5)


def test_reader_connect_waits_out_a_full_backlog(short_dir: Path) -> None:
    path = short_dir / protocol.socket_name(6)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0)  # the backlog fills at once: further connects get EAGAIN until we accept
    accepted: list[socket.socket] = []

    def accept_later() -> None:
        time.sleep(0.3)
        server.settimeout(3)
        with contextlib.suppress(OSError):
            for _ in range(4):
                accepted.append(server.accept()[0])

    t = threading.Thread(target=accept_later, daemon=True)
    t.start()
    readers = [Reader(path, timeout=3.0) for _ in range(4)]
    t.join(5)
    assert len(accepted) == 4
    for r in readers:
        r.close()
    for c in accepted:
        c.close()
    server.close()


# -- names, discovery, runtime directory -----------------------------------------------------------


def test_socket_names_carry_the_pid() -> None:
    assert protocol.pid_from_path(Path("/x") / protocol.socket_name(123)) == 123
    assert protocol.pid_from_path(protocol.socket_name(77, "1")) == 77
    assert protocol.pid_from_path(protocol.oom_path(Path("/x"), 55)) == 55
    assert protocol.pid_from_path("anatomy-abc.sock") is None
    assert protocol.pid_from_path("something-12.sock") is None


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _socket_file(path: Path) -> None:
    """A socket file nobody listens on (what a hook killed with SIGKILL leaves)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()


def test_discover_keeps_live_sockets_and_removes_stale_ones(short_dir: Path) -> None:
    live = short_dir / protocol.socket_name(os.getpid())
    stale = short_dir / protocol.socket_name(_dead_pid())
    unrelated = short_dir / "notes.txt"
    for p in (live, stale):
        _socket_file(p)
    unrelated.write_text("")
    assert protocol.discover(short_dir) == [live]
    assert not stale.exists() and unrelated.exists()


def test_discover_ignores_and_never_removes_what_is_not_a_socket(short_dir: Path) -> None:
    # Regular files, FIFOs and links planted under a socket's name: not publishers, and not ours to delete.
    live_file = short_dir / protocol.socket_name(os.getpid())
    live_file.write_text("")
    stale_file = short_dir / protocol.socket_name(_dead_pid())
    stale_file.write_text("precious")
    fifo = short_dir / protocol.socket_name(1)
    os.mkfifo(fifo)
    link = short_dir / protocol.socket_name(os.getppid())
    link.symlink_to(live_file)
    assert protocol.discover(short_dir) == []
    assert stale_file.read_text() == "precious" and fifo.exists() and link.is_symlink()


def test_discover_keeps_a_listening_socket_whose_pid_it_cannot_see(short_dir: Path) -> None:
    # A hook in another container sharing the directory: its PID is not alive in our namespace.
    path = short_dir / protocol.socket_name(_dead_pid())
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    try:
        assert protocol.discover(short_dir) == [path]
    finally:
        server.close()
    assert protocol.discover(short_dir) == [] and not path.exists()  # now nobody listens: stale


def test_pid_zero_is_not_alive() -> None:
    assert not protocol.pid_alive(0)
    assert protocol.pid_alive(os.getpid())
    assert not protocol.pid_alive(_dead_pid())


def test_runtime_dir_honours_the_override_and_is_private(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = short_dir / "rt"
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(target))
    assert protocol.runtime_dir() == target and not target.exists()
    assert protocol.runtime_dir(create=True) == target
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    os.chmod(target, 0o755)
    protocol.runtime_dir(create=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    monkeypatch.delenv("ANATOMY_TOP_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_dir))
    assert protocol.runtime_dir() == short_dir / "anatomy-top"


def test_runtime_dir_refuses_a_non_directory(short_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = short_dir / "file"
    f.write_text("")
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(f))
    with pytest.raises((PermissionError, FileExistsError)):
        protocol.runtime_dir(create=True)


# -- OOM files ----------------------------------------------------------------------------------


def test_oom_file_round_trip_is_private(short_dir: Path) -> None:
    snap = Snapshot(**{**make_snapshot().__dict__, "oom": "CUDA out of memory. Tried to allocate 2 GiB"})
    path = protocol.write_oom_file(short_dir, make_hello(), snap)
    assert path == protocol.oom_path(short_dir, 4242)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert protocol.read_oom_file(path) == (make_hello(), snap)
    assert protocol.discover_oom(short_dir) == [path]
    assert protocol.discover(short_dir) == []  # an OOM file is not a socket


def test_unencodable_oom_snapshot_leaves_no_file(short_dir: Path) -> None:
    bad = Snapshot(**{**make_snapshot().__dict__, "mfu": float("inf")})
    with pytest.raises(ProtocolError):
        protocol.write_oom_file(short_dir, make_hello(), bad)
    assert list(short_dir.iterdir()) == []


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{}\n",
        protocol.encode(make_hello()),
        protocol.encode(make_snapshot()) + protocol.encode(make_hello()),
        protocol.encode(make_hello()) * 3,
    ],
)
def test_bad_oom_files_raise_protocol_error(short_dir: Path, content: bytes) -> None:
    path = short_dir / "anatomy-1.oom.json"
    path.write_bytes(content)
    with pytest.raises(ProtocolError):
        protocol.read_oom_file(path)


def test_file_identity_tells_a_new_socket_at_the_same_path_from_the_old(short_dir: Path) -> None:
    """The publisher (before removing "its" socket) and the monitor (a dismissed socket) ask the same
    question: is this still the file I saw? A removed socket's inode number may go to the next file, so
    the identity carries the change time too; and it is the name's own, never a link's target."""
    path = short_dir / protocol.socket_name(7)
    assert protocol.file_identity(path) is None
    _socket_file(path)
    first = protocol.file_identity(path)
    assert first is not None and first == protocol.file_identity(path)  # stable while the file stays
    path.unlink()
    time.sleep(0.05)  # past the kernel's coarse clock tick, so that a reused inode gets a new change time
    _socket_file(path)
    assert protocol.file_identity(path) not in (None, first)
    link = short_dir / "link"
    link.symlink_to(path)
    assert protocol.file_identity(link) != protocol.file_identity(path)
