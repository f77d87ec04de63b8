"""anatomy.protocol.publisher: the hook's Unix socket server, exercised with real sockets and processes."""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from anatomy import protocol
from anatomy.protocol import Hello, Reader, Snapshot, Suggestion
from anatomy.protocol.publisher import MAX_INBOUND_BYTES, Publisher


def make_hello() -> Hello:
    return Hello(
        pid=os.getpid(),
        host="test-host",
        device="cpu",
        precision="fp32",
        optimizer="adamw",
        model_class="TinyModel",
        parameter_count=1000,
        torch_version="2.13.0",
        started_at=time.time(),
    )


_PAD = Suggestion("pad", "padding", "p" * 4000, "guide")


def make_snapshot(seq: int, padding: int = 0) -> Snapshot:
    # Protocol strings are capped at 4096 characters: pad with several suggestions (sharing one string).
    suggestions = [_PAD] * (padding // len(_PAD.detail))
    return Snapshot(
        pid=os.getpid(),
        seq=seq,
        time=time.time(),
        step=seq,
        memory={"weights": 4000, "gradients": 4000},
        expected_bytes_per_param={"weights": 4.0},
        parameter_count=1000,
        suggestions=suggestions,
    )


def latest_seq(reader: Reader) -> int | None:
    reader.poll()
    return reader.snapshot.seq if reader.snapshot is not None else None


def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture
def rt_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to ~108 bytes; pytest's tmp_path can be longer.
    d = Path(tempfile.mkdtemp(prefix="at-", dir="/tmp"))
    try:
        yield d / "rt"
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def make_publisher(rt_dir: Path) -> Iterator[Callable[..., Publisher]]:
    made: list[Publisher] = []

    def make(interval_s: float = 0.05, start: bool = True) -> Publisher:
        pub = Publisher(make_hello(), interval_s=interval_s, directory=rt_dir)
        made.append(pub)
        if start:
            assert pub.start() is not None
        return pub

    yield make
    for pub in made:
        pub.close()


class LineCounter:
    """A raw reader that keeps every decoded message, to count what the publisher sent."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.buf = b""
        self.messages: list[protocol.Message] = []
        self.eof = False

    def pump(self, duration: float) -> None:
        deadline = time.monotonic() + duration
        while not self.eof and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.sock], [], [], left)
            if not ready:
                continue
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                self.eof = True
                break
            self.buf += chunk
            *lines, self.buf = self.buf.split(b"\n")
            self.messages.extend(protocol.decode(line) for line in lines)

    def pump_until(self, cond: Callable[[LineCounter], bool], timeout: float = 5.0) -> None:
        """Read until ``cond`` holds (or the timeout passes: the caller's assertion then fails)."""
        deadline = time.monotonic() + timeout
        while not cond(self) and not self.eof and time.monotonic() < deadline:
            self.pump(0.05)

    @property
    def snapshots(self) -> list[Snapshot]:
        return [m for m in self.messages if isinstance(m, Snapshot)]

    def close(self) -> None:
        self.sock.close()


# -- basics ----------------------------------------------------------------------------------------


def test_reader_gets_hello_then_latest_snapshot(make_publisher: Callable[..., Publisher]) -> None:
    pub = make_publisher()
    pub.publish(make_snapshot(1))
    pub.publish(make_snapshot(2))
    assert pub.path is not None and protocol.pid_from_path(pub.path) == os.getpid()
    with Reader(pub.path) as r:
        r.wait(timeout=5)
        assert r.hello == pub.hello
        assert r.snapshot is not None and r.snapshot.seq == 2


def test_snapshot_published_after_connect_arrives(make_publisher: Callable[..., Publisher]) -> None:
    pub = make_publisher()
    assert pub.path is not None
    with Reader(pub.path) as r:
        r.wait(timeout=5, need_snapshot=False)
        assert r.snapshot is None
        pub.publish(make_snapshot(5))
        r.wait(timeout=5)
        assert r.snapshot is not None and r.snapshot.seq == 5


def test_many_readers_at_once(make_publisher: Callable[..., Publisher]) -> None:
    pub = make_publisher()
    assert pub.path is not None
    pub.publish(make_snapshot(1))
    readers = [Reader(pub.path) for _ in range(20)]
    try:
        assert wait_until(lambda: pub.reader_count == 20)
        pub.publish(make_snapshot(2))
        for r in readers:
            r.wait(timeout=5)
        assert wait_until(lambda: all(latest_seq(r) == 2 for r in readers))
        assert all(r.hello == pub.hello for r in readers)
    finally:
        for r in readers:
            r.close()
    assert wait_until(lambda: pub.reader_count == 0)


def test_latest_only_and_rate_limited(make_publisher: Callable[..., Publisher]) -> None:
    interval = 0.1
    pub = make_publisher(interval_s=interval)
    assert pub.path is not None
    counter = LineCounter(pub.path)
    try:
        counter.pump_until(lambda c: len(c.messages) >= 1)
        t0 = time.monotonic()
        for seq in range(1000):
            pub.publish(make_snapshot(seq))
        counter.pump_until(lambda c: bool(c.snapshots) and c.snapshots[-1].seq == 999)
        counter.pump(interval)  # anything more would be a duplicate
        elapsed = time.monotonic() - t0
        snaps = counter.snapshots
        assert snaps and snaps[-1].seq == 999
        # At most one snapshot per interval (plus the first one right away).
        assert len(snaps) <= elapsed / interval + 2
        seqs = [s.seq for s in snaps]
        assert seqs == sorted(set(seqs))  # never stale, never repeated
    finally:
        counter.close()


def test_same_snapshot_is_not_sent_twice_to_a_new_reader(make_publisher: Callable[..., Publisher]) -> None:
    pub = make_publisher(interval_s=0.05)
    assert pub.path is not None
    pub.publish(make_snapshot(1))
    counter = LineCounter(pub.path)
    try:
        counter.pump_until(lambda c: len(c.messages) >= 2)
        counter.pump(0.3)  # a duplicate would come within a few intervals
        assert [type(m).__name__ for m in counter.messages] == ["Hello", "Snapshot"]
    finally:
        counter.close()


def test_set_hello_reaches_connected_and_new_readers(make_publisher: Callable[..., Publisher]) -> None:
    pub = make_publisher()
    assert pub.path is not None
    pub.publish(make_snapshot(1))
    counter = LineCounter(pub.path)
    try:
        counter.pump_until(lambda c: len(c.messages) >= 2)
        later = dataclasses.replace(pub.hello, optimizer="sgd_momentum", optimizer_class="SGD")
        pub.set_hello(later)
        pub.publish(make_snapshot(2))
        counter.pump_until(lambda c: len(c.messages) >= 4)
        counter.pump(0.1)
        kinds = [(type(m).__name__, getattr(m, "seq", None)) for m in counter.messages]
        assert kinds == [("Hello", None), ("Snapshot", 1), ("Hello", None), ("Snapshot", 2)]
        assert counter.messages[2] == later
        with Reader(pub.path) as fresh:
            fresh.wait(timeout=5)
            assert fresh.hello == later and fresh.snapshot is not None and fresh.snapshot.seq == 2
    finally:
        counter.close()


# -- hostile and broken readers ----------------------------------------------------------------------


def test_stuck_reader_costs_bounded_memory_and_never_slows_publish(
    make_publisher: Callable[..., Publisher],
) -> None:
    pub = make_publisher(interval_s=0.01)
    assert pub.path is not None
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(str(pub.path))  # ...and never reads
    healthy = Reader(pub.path)
    try:
        assert wait_until(lambda: pub.reader_count == 2)
        snapshots = [make_snapshot(seq, padding=100_000) for seq in range(10_000)]
        message_size = len(protocol.encode(snapshots[0]))
        # Per reader: the message being written and the newest one waiting (the healthy reader is
        # only drained now and then, so it may hold as much as the stuck one).
        bound = 2 * (2 * message_size + len(protocol.encode(pub.hello)))
        worst_buffered = 0
        worst_publish = 0.0
        tracemalloc.start()  # traces the server thread's allocations too
        baseline = tracemalloc.get_traced_memory()[0]
        for i, snap in enumerate(snapshots):
            t = time.perf_counter()
            pub.publish(snap)
            worst_publish = max(worst_publish, time.perf_counter() - t)
            if i % 200 == 0:
                time.sleep(0.012)  # let the server thread send (and fill the stuck socket)
                worst_buffered = max(worst_buffered, pub.buffered_bytes())
                healthy.poll()
        assert wait_until(lambda: pub.buffered_bytes() > 0)  # the stuck one is really stuck
        worst_buffered = max(worst_buffered, pub.buffered_bytes())
        assert worst_buffered <= bound, (worst_buffered, bound)
        # publish() is a reference swap: even the slowest of 10^4 calls is far below a millisecond.
        assert worst_publish < 0.05
        # A stuck reader does not hold back the others.
        assert wait_until(lambda: latest_seq(healthy) == 9999)
        # Independent of the publisher's own accounting: what the process holds now, beyond what
        # it held before the 10^4 publishes, is a few messages (a queue would be thousands).
        grown = tracemalloc.get_traced_memory()[0] - baseline
        assert grown < 8 * message_size, (grown, message_size)
    finally:
        tracemalloc.stop()
        stuck.close()
        healthy.close()


def test_garbage_sending_reader_is_ignored_then_dropped_when_flooding(
    make_publisher: Callable[..., Publisher],
) -> None:
    pub = make_publisher()
    assert pub.path is not None
    pub.publish(make_snapshot(1))
    chatty = LineCounter(pub.path)
    flood = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    flood.connect(str(pub.path))
    bystander = Reader(pub.path)
    try:
        chatty.pump_until(lambda c: len(c.snapshots) >= 1)
        chatty.sock.sendall(b'{"type": "please", "crash": true}\n\x00\xff garbage\n' * 20)
        pub.publish(make_snapshot(2))
        chatty.pump_until(lambda c: len(c.snapshots) >= 2)
        assert [s.seq for s in chatty.snapshots] == [1, 2]  # still served
        flood.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 5
        while sent <= 4 * MAX_INBOUND_BYTES and time.monotonic() < deadline:
            try:
                sent += flood.send(b"x" * 4096)
            except BlockingIOError:
                time.sleep(0.01)
            except OSError:
                break  # dropped already
        assert wait_until(lambda: pub.reader_count == 2)  # the flooder was disconnected
        pub.publish(make_snapshot(3))
        bystander.wait(timeout=5)
        assert wait_until(lambda: latest_seq(bystander) == 3)
    finally:
        chatty.close()
        flood.close()
        bystander.close()


def test_killed_reader_is_dropped_quietly(make_publisher: Callable[..., Publisher]) -> None:
    pub = make_publisher(interval_s=0.01)
    assert pub.path is not None
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
        f"s.connect({str(pub.path)!r})\n"
        "print('connected', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"connected"
        assert wait_until(lambda: pub.reader_count == 1)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
        for seq in range(50):  # writes to the dead peer: EPIPE/ECONNRESET, never SIGPIPE
            pub.publish(make_snapshot(seq, padding=50_000))
            time.sleep(0.005)
        assert wait_until(lambda: pub.reader_count == 0)
        assert pub.readers_dropped >= 1
        with Reader(pub.path) as r:  # still serving
            r.wait(timeout=5)
            assert r.snapshot is not None and r.snapshot.seq == 49
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(5)


# -- files, permissions, lifecycle -------------------------------------------------------------------


def test_private_directory_and_socket(rt_dir: Path, make_publisher: Callable[..., Publisher]) -> None:
    rt_dir.mkdir(mode=0o755)
    os.chmod(rt_dir, 0o755)
    pub = make_publisher()
    assert pub.path is not None
    assert stat.S_IMODE(rt_dir.stat().st_mode) == 0o700
    st = pub.path.stat()
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


def test_close_removes_the_socket_and_readers_see_eof(make_publisher: Callable[..., Publisher]) -> None:
    pub = make_publisher()
    path = pub.path
    assert path is not None and path.exists()
    r = Reader(path)
    r.wait(timeout=5, need_snapshot=False)
    pub.close()
    assert not path.exists()
    assert wait_until(lambda: (r.poll() or True) and r.closed)
    r.close()
    pub.close()  # idempotent
    pub.publish(make_snapshot(1))  # harmless after close
    assert pub.reader_count == 0


def test_close_sends_the_last_snapshot_regardless_of_the_interval(
    make_publisher: Callable[..., Publisher],
) -> None:
    pub = make_publisher(interval_s=30.0)
    assert pub.path is not None
    pub.publish(make_snapshot(1))
    counter = LineCounter(pub.path)
    try:
        counter.pump_until(lambda c: len(c.snapshots) >= 1)
        assert [s.seq for s in counter.snapshots] == [1]
        pub.publish(make_snapshot(2))  # the tracker's final snapshot, published just before close()
        pub.close()
        counter.pump_until(lambda c: c.eof)
        assert counter.eof and [s.seq for s in counter.snapshots] == [1, 2]
    finally:
        counter.close()


def test_socket_removed_at_interpreter_exit_without_close(rt_dir: Path) -> None:
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from anatomy.protocol import Hello\n"
        "from anatomy.protocol.publisher import Publisher\n"
        "h = Hello(pid=0, host='h', device='cpu', precision='fp32', optimizer='sgd', model_class='M',\n"
        "          parameter_count=1, torch_version='x', started_at=time.time())\n"
        "p = Publisher(h, directory=Path(sys.argv[1]))\n"
        "print(p.start(), flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(rt_dir)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    path = Path(out.stdout.strip())
    assert path.parent == rt_dir and path.name.startswith("anatomy-")
    assert not path.exists()


def test_stale_socket_of_a_dead_process_is_cleaned(
    rt_dir: Path, make_publisher: Callable[..., Publisher]
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    rt_dir.mkdir(mode=0o700)
    stale = rt_dir / protocol.socket_name(proc.pid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()
    assert stale.exists()
    make_publisher()
    assert not stale.exists()


def test_a_leftover_socket_with_our_name_is_replaced(
    rt_dir: Path, make_publisher: Callable[..., Publisher]
) -> None:
    rt_dir.mkdir(mode=0o700)
    leftover = rt_dir / protocol.socket_name(os.getpid())
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(leftover))  # a hook killed with SIGKILL under a PID we now have
    dead.close()
    pub = make_publisher()
    assert pub.path == leftover and stat.S_ISSOCK(leftover.stat().st_mode)
    with Reader(leftover) as r:
        r.wait(timeout=5, need_snapshot=False)


def test_a_regular_file_at_our_socket_path_is_never_deleted(
    rt_dir: Path, make_publisher: Callable[..., Publisher]
) -> None:
    rt_dir.mkdir(mode=0o700)
    planted = rt_dir / protocol.socket_name(os.getpid())
    planted.write_text("someone's notes")
    pub = make_publisher()
    assert planted.read_text() == "someone's notes"  # left alone, before and after
    assert pub.path is not None and pub.path != planted and protocol.pid_from_path(pub.path) == os.getpid()
    with Reader(pub.path) as r:
        r.wait(timeout=5, need_snapshot=False)
    pub.close()
    assert planted.read_text() == "someone's notes" and not pub.path.exists()


def test_two_publishers_in_one_process_get_distinct_sockets(make_publisher: Callable[..., Publisher]) -> None:
    a, b = make_publisher(), make_publisher()
    assert a.path is not None and b.path is not None and a.path != b.path
    assert protocol.pid_from_path(a.path) == protocol.pid_from_path(b.path) == os.getpid()
    assert sorted(protocol.discover(a.path.parent)) == sorted([a.path, b.path])


def test_start_failure_returns_none_logs_once_and_never_raises(
    rt_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rt_dir.parent.mkdir(exist_ok=True)
    rt_dir.write_text("a file where the directory should be")
    pub = Publisher(make_hello(), directory=rt_dir)
    with caplog.at_level(logging.WARNING, logger="anatomy"):
        assert pub.start() is None
        assert pub.start() is None
    assert pub.path is None
    assert len([r for r in caplog.records if "could not start" in r.getMessage()]) == 1
    pub.publish(make_snapshot(1))
    pub.close()


def test_socket_path_too_long_fails_gracefully(rt_dir: Path) -> None:
    deep = rt_dir / ("d" * 120)
    pub = Publisher(make_hello(), directory=deep)
    assert pub.start() is None
    pub.close()


def test_unencodable_snapshot_is_skipped_and_logged_once(
    make_publisher: Callable[..., Publisher], caplog: pytest.LogCaptureFixture
) -> None:
    pub = make_publisher()
    assert pub.path is not None
    with caplog.at_level(logging.WARNING, logger="anatomy"), Reader(pub.path) as r:
        r.wait(timeout=5, need_snapshot=False)
        pub.publish(dataclasses.replace(make_snapshot(1), mfu=float("nan")))
        assert wait_until(lambda: any("could not be encoded" in rec.getMessage() for rec in caplog.records))
        bad = dataclasses.replace(make_snapshot(2), mfu=float("inf"))
        pub.publish(bad)
        assert wait_until(lambda: pub.last_taken is bad)  # the server thread tried it
        pub.publish(make_snapshot(3))
        r.wait(timeout=5)
        assert r.snapshot is not None and r.snapshot.seq == 3
    assert len([rec for rec in caplog.records if "could not be encoded" in rec.getMessage()]) == 1


def test_write_oom_round_trip(make_publisher: Callable[..., Publisher]) -> None:
    pub = make_publisher()
    path = pub.write_oom(make_snapshot(9))
    assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o600
    hello, snap = protocol.read_oom_file(path)
    assert hello == pub.hello
    assert snap == dataclasses.replace(make_snapshot(9), time=snap.time, oom="out of memory")
    explicit = dataclasses.replace(make_snapshot(10), oom="CUDA out of memory. Tried to allocate 20.00 MiB")
    path2 = pub.write_oom(explicit)
    assert path2 == path and protocol.read_oom_file(path)[1] == explicit


def test_write_oom_never_raises(rt_dir: Path) -> None:
    rt_dir.parent.mkdir(exist_ok=True)
    rt_dir.write_text("not a directory")
    pub = Publisher(make_hello(), directory=rt_dir)
    assert pub.write_oom(make_snapshot(1)) is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_neither_serves_nor_unlinks(make_publisher: Callable[..., Publisher]) -> None:
    pub = make_publisher()
    path = pub.path
    assert path is not None
    pub.publish(make_snapshot(1))
    with Reader(path) as early:
        early.wait(timeout=5)
        pid = os.fork()
        if pid == 0:  # the child: what a DataLoader worker would do at exit
            code = 0
            try:
                pub.publish(make_snapshot(666))
                pub.close()
                code = 0 if path.exists() and pub.reader_count == 0 else 3
            except BaseException:
                code = 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert path.exists()
        pub.publish(make_snapshot(2))
        early.wait(timeout=5)
        assert wait_until(lambda: latest_seq(early) == 2)
        with Reader(path) as late:
            late.wait(timeout=5)
            assert late.snapshot is not None and late.snapshot.seq == 2
