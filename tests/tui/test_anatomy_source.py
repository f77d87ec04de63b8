"""AnatomySource against hand-made hook sockets (a tiny server speaking the wire protocol) and OOM files."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from anatomy import protocol
from anatomy.protocol import CudaMemory, Hello, Snapshot, Timing
from anatomy.vocabulary import Component
from tui.sources.anatomy_source import HISTORY_LEN, AnatomySource, measured_total, rank_group_key


def make_hello(pid: int, rank: int | None = None, world_size: int | None = None) -> Hello:
    return Hello(
        pid=pid,
        host="box",
        device="cpu",
        precision="fp32",
        optimizer="adamw",
        model_class="BertForSequenceClassification",
        parameter_count=1_000_000,
        torch_version="2.13.0",
        started_at=1_795_000_000.0,
        rank=rank,
        world_size=world_size,
    )


def make_snapshot(pid: int, seq: int, weights: int = 4_000_000, step_s: float | None = 0.25) -> Snapshot:
    memory: dict[str, int | None] = {
        Component.WEIGHTS.value: weights,
        Component.OPTIMIZER_STATES.value: 8_000_000,
        Component.GRADIENTS.value: 4_000_000,
        Component.ACTIVATIONS.value: 10_000_000 + seq,
        Component.TEMPORARIES.value: 1_000_000,
        Component.UNATTRIBUTED.value: None,
    }
    return Snapshot(
        pid=pid,
        seq=seq,
        time=time.time(),
        step=seq,
        memory=memory,
        expected_bytes_per_param={"weights": 4.0},
        parameter_count=1_000_000,
        timing=Timing(step_s=step_s),
    )


class FakeHook:
    """A Unix socket server that sends exactly the bytes the test hands it, to every reader."""

    def __init__(self, directory: Path, pid: int, tag: str | None = None) -> None:
        self.path = directory / protocol.socket_name(pid, tag)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(self.path))
        self.server.listen(8)
        self.conns: list[socket.socket] = []
        self.accepted = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.accepted.set()

    def send(self, data: bytes) -> None:
        assert self.accepted.wait(5), "no reader connected"
        for conn in self.conns:
            conn.sendall(data)

    def send_msg(self, msg: Hello | Snapshot) -> None:
        self.send(protocol.encode(msg))

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        self.server.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def hooks(tmp_path: Path):
    made: list[FakeHook] = []

    def factory(pid: int | None = None, tag: str | None = None) -> FakeHook:
        hook = FakeHook(tmp_path, pid if pid is not None else os.getpid(), tag)
        made.append(hook)
        return hook

    yield factory
    for hook in made:
        hook.close()


def poll_until(source: AnatomySource, predicate, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while True:
        procs = source.poll()
        if predicate(procs) or time.monotonic() > deadline:
            return procs
        time.sleep(0.02)


def test_live_process_with_history(tmp_path: Path, hooks) -> None:
    pid = os.getpid()
    hook = hooks()
    with AnatomySource(tmp_path) as source:
        assert source.poll() == [] or source.poll()[0].snapshot is None
        hello = make_hello(pid)
        hook.send_msg(hello)
        sent = [make_snapshot(pid, seq) for seq in range(1, 4)]
        for snap in sent:
            hook.send_msg(snap)
            procs = poll_until(source, lambda ps, s=snap: bool(ps) and ps[0].snapshot == s)
        hook.send_msg(sent[-1])  # the same snapshot again adds no history
        procs = poll_until(source, lambda ps: False, timeout=0.1)
    (proc,) = procs
    assert proc.state == "live" and proc.pid == pid and proc.hello == hello
    assert proc.snapshot == sent[-1]
    # A hook that sends no peak: the sum of what it measured (with a peak, the peak: see the live test).
    assert all(s.peak_bytes is None for s in sent)
    assert proc.memory_history == tuple(sum(v for v in s.memory.values() if v is not None) for s in sent)
    assert proc.step_time_history == (0.25, 0.25, 0.25)
    assert proc.total_bytes == measured_total(sent[-1])
    assert proc.rank_group == rank_group_key(hello)


def test_history_is_bounded(tmp_path: Path, hooks) -> None:
    pid = os.getpid()
    hook = hooks()
    with AnatomySource(tmp_path) as source:
        source.poll()
        hook.send_msg(make_hello(pid))
        for seq in range(HISTORY_LEN + 30):
            hook.send_msg(make_snapshot(pid, seq))
            poll_until(source, lambda ps, q=seq: bool(ps) and ps[0].snapshot and ps[0].snapshot.seq == q)
        (proc,) = source.poll()
    assert len(proc.memory_history) == HISTORY_LEN
    # the newest one is last
    assert proc.memory_history[-1] == measured_total(make_snapshot(pid, HISTORY_LEN + 29))


def test_exit_keeps_last_snapshot_then_expires(tmp_path: Path, hooks) -> None:
    now = [1000.0]
    pid = os.getpid()
    hook = hooks()
    with AnatomySource(tmp_path, exited_ttl_s=60, clock=lambda: now[0]) as source:
        source.poll()
        hook.send_msg(make_hello(pid))
        last = make_snapshot(pid, 7)
        hook.send_msg(last)
        poll_until(source, lambda ps: bool(ps) and ps[0].snapshot == last)
        hook.close()
        (proc,) = poll_until(source, lambda ps: bool(ps) and ps[0].state == "exited")
        assert proc.state == "exited" and proc.snapshot == last
        now[0] += 59
        assert [p.state for p in source.poll()] == ["exited"]
        now[0] += 2
        assert source.poll() == []


def test_garbage_is_an_error_value_and_is_retried_later(tmp_path: Path, hooks) -> None:
    now = [0.0]
    pid = os.getpid()
    hook = hooks()
    with AnatomySource(tmp_path, retry_s=5, clock=lambda: now[0]) as source:
        source.poll()
        hook.send_msg(make_hello(pid))
        hook.send(b'{"protocol": 1, "type": "snapshot", "pid": 1}\n')
        (proc,) = poll_until(source, lambda ps: bool(ps) and ps[0].state == "error")
        assert proc.state == "error"
        assert (proc.error or "").startswith("protocol error: missing field")
        assert proc.hello == make_hello(pid)  # what arrived before the bad message is kept
        connections_before = len(hook.conns)
        source.poll()
        time.sleep(0.1)
        assert len(hook.conns) == connections_before  # not retried on every poll
        now[0] += 6
        source.poll()
        deadline = time.monotonic() + 5
        while len(hook.conns) == connections_before and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(hook.conns) == connections_before + 1
        (proc,) = source.poll()
        assert proc.state == "live"


def test_other_protocol_version_is_reported(tmp_path: Path, hooks) -> None:
    hook = hooks()
    with AnatomySource(tmp_path) as source:
        source.poll()
        hook.send(b'{"protocol": 99, "type": "hello"}\n')
        (proc,) = poll_until(source, lambda ps: bool(ps) and ps[0].state == "error")
    assert "protocol version 99" in (proc.error or "")


def test_refused_socket_does_not_block(tmp_path: Path) -> None:
    # A socket file whose server is gone (but whose PID is alive) refuses connections.
    path = tmp_path / protocol.socket_name(os.getpid())
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()
    with AnatomySource(tmp_path) as source:
        t0 = time.monotonic()
        (proc,) = source.poll()
        assert time.monotonic() - t0 < 1.0
    assert proc.state == "error" and "cannot connect" in (proc.error or "")


def test_dismiss_exited_and_failed_records(tmp_path: Path, hooks) -> None:
    pid = os.getpid()
    hook = hooks()
    refused = tmp_path / protocol.socket_name(pid, "stale")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(refused))
    s.close()
    with AnatomySource(tmp_path, retry_s=0.0) as source:
        source.poll()
        hook.send_msg(make_hello(pid))
        hook.send_msg(make_snapshot(pid, 1))
        procs = poll_until(source, lambda ps: any(p.snapshot for p in ps))
        assert sorted(p.state for p in procs) == ["error", "live"]
        assert source.dismiss(pid)  # the failed socket goes, the live one stays
        assert [p.state for p in source.poll()] == ["live"]
        assert [p.state for p in source.poll()] == ["live"]  # not retried once dismissed
        hook.close()
        poll_until(source, lambda ps: [p.state for p in ps] == ["exited"])
        assert source.dismiss(pid)
        assert source.poll() == []
        assert not source.dismiss(pid)
        # a new socket at the dismissed path is a new hook: shown again
        refused.unlink()
        fresh = hooks(tag="stale")
        procs = poll_until(source, lambda ps: len(ps) == 1)
        assert [p.path for p in procs] == [fresh.path]


def test_new_tracker_on_the_same_path_is_followed(tmp_path: Path, hooks) -> None:
    pid = os.getpid()
    first = hooks()
    with AnatomySource(tmp_path) as source:
        source.poll()
        first.send_msg(make_hello(pid))
        first.send_msg(make_snapshot(pid, 1))
        poll_until(source, lambda ps: bool(ps) and ps[0].snapshot is not None)
        first.close()
        poll_until(source, lambda ps: [p.state for p in ps] == ["exited"])
        second = hooks()  # the same process starts tracking again: same socket name
        source.poll()
        second.send_msg(make_hello(pid))
        second.send_msg(make_snapshot(pid, 1, weights=123))
        (proc,) = poll_until(
            source, lambda ps: bool(ps) and ps[0].state == "live" and ps[0].snapshot.memory["weights"] == 123
        )
    assert proc.state == "live" and proc.snapshot.memory["weights"] == 123


def test_silent_server_does_not_block(tmp_path: Path, hooks) -> None:
    hook = hooks()
    with AnatomySource(tmp_path) as source:
        t0 = time.monotonic()
        for _ in range(5):
            procs = source.poll()
        assert time.monotonic() - t0 < 1.0
    assert [p.state for p in procs] == ["live"] and procs[0].hello is None
    assert hook.accepted.wait(2)


def test_wait_for_first_snapshot(tmp_path: Path, hooks) -> None:
    pid = os.getpid()
    hook = hooks()
    snap = make_snapshot(pid, 1)

    def later() -> None:
        time.sleep(0.2)
        hook.send_msg(make_hello(pid))
        hook.send_msg(snap)

    threading.Thread(target=later, daemon=True).start()
    with AnatomySource(tmp_path) as source:
        t0 = time.monotonic()
        (proc,) = source.poll(wait_for_first_s=3.0)
        waited = time.monotonic() - t0
    assert proc.snapshot == snap
    assert 0.15 < waited < 2.5  # returned when the snapshot came, not at the 3 s deadline


def test_wait_for_first_snapshot_gives_up_in_time(tmp_path: Path, hooks) -> None:
    hooks()
    with AnatomySource(tmp_path) as source:
        t0 = time.monotonic()
        (proc,) = source.poll(wait_for_first_s=0.3)
        waited = time.monotonic() - t0
    assert proc.snapshot is None and 0.25 < waited < 1.5


def test_oom_file_of_dead_process_then_dismiss(tmp_path: Path) -> None:
    dead_pid = 2**22 - 3  # above the usual pid_max: certainly not alive
    hello = make_hello(dead_pid)
    snap = replace(make_snapshot(dead_pid, 9), oom="CUDA out of memory. Tried to allocate 2.00 GiB")
    protocol.write_oom_file(tmp_path, hello, snap)
    with AnatomySource(tmp_path) as source:
        (proc,) = source.poll()
        assert proc.state == "oom" and proc.pid == dead_pid
        assert proc.oom == "CUDA out of memory. Tried to allocate 2.00 GiB"
        assert proc.snapshot == snap and proc.hello == hello
        assert source.poll()[0].state == "oom"  # kept
        assert source.dismiss(dead_pid)
        assert source.poll() == []
        # a new OOM file (new mtime) shows again
        time.sleep(0.01)
        protocol.write_oom_file(tmp_path, hello, replace(snap, seq=10))
        os.utime(protocol.oom_path(tmp_path, dead_pid), ns=(time.time_ns(), time.time_ns() + 10**9))
        assert [p.snapshot.seq for p in source.poll() if p.snapshot] == [10]
        protocol.oom_path(tmp_path, dead_pid).unlink()
        assert source.poll() == []


def test_an_oom_dismissal_holds_for_every_monitor_until_a_new_record(tmp_path: Path) -> None:
    dead_pid = 2**22 - 5
    hello = make_hello(dead_pid)
    snap = replace(make_snapshot(dead_pid, 9), oom="CUDA out of memory")
    record = protocol.write_oom_file(tmp_path, hello, snap)
    with AnatomySource(tmp_path) as first:
        assert [p.state for p in first.poll()] == ["oom"]
        assert first.dismiss(dead_pid)
    marker = record.with_name(record.name + ".dismissed")
    assert marker.exists() and oct(marker.stat().st_mode & 0o777) == "0o600"
    with AnatomySource(tmp_path) as second:  # another monitor, later: still dismissed
        assert second.poll() == []
        time.sleep(0.01)
        protocol.write_oom_file(tmp_path, hello, replace(snap, seq=10))  # a new OOM of that PID
        os.utime(record, ns=(time.time_ns(), time.time_ns() + 10**9))
        assert [p.snapshot.seq for p in second.poll() if p.snapshot] == [10]
        record.unlink()
        assert second.poll() == [] and not marker.exists()  # the marker goes with its record


def test_unreadable_oom_file_is_a_value(tmp_path: Path) -> None:
    protocol.oom_path(tmp_path, 4_000_000).write_text("[not json\n")
    with AnatomySource(tmp_path) as source:
        (proc,) = source.poll()
    assert proc.state == "oom" and proc.snapshot is None and "unreadable" in (proc.error or "")


def test_oom_after_exit_replaces_last_live_snapshot(tmp_path: Path, hooks) -> None:
    pid = os.getpid()
    hook = hooks()
    with AnatomySource(tmp_path) as source:
        source.poll()
        hook.send_msg(make_hello(pid))
        hook.send_msg(make_snapshot(pid, 3))
        poll_until(source, lambda ps: bool(ps) and ps[0].snapshot is not None)
        oom_snap = replace(make_snapshot(pid, 4), oom="out of memory")
        protocol.write_oom_file(tmp_path, make_hello(pid), oom_snap)
        hook.close()
        (proc,) = poll_until(source, lambda ps: bool(ps) and ps[0].state == "oom")
    assert proc.state == "oom" and proc.snapshot == oom_snap and proc.oom == "out of memory"
    assert len(proc.memory_history) == 1  # history of the live phase kept


def test_ranks_share_a_group(tmp_path: Path, hooks) -> None:
    pid = os.getpid()
    hook_a, hook_b = hooks(tag="r0"), hooks(tag="r1")
    with AnatomySource(tmp_path) as source:
        source.poll()
        for rank, hook in enumerate((hook_a, hook_b)):
            hook.send_msg(make_hello(pid, rank=rank, world_size=2))
            hook.send_msg(make_snapshot(pid, 1))
        procs = poll_until(source, lambda ps: len(ps) == 2 and all(p.snapshot for p in ps))
    assert sorted(p.rank for p in procs) == [0, 1]
    assert procs[0].rank_group == procs[1].rank_group == "box|2|BertForSequenceClassification"


def test_missing_directory_and_close(tmp_path: Path) -> None:
    source = AnatomySource(tmp_path / "does-not-exist")
    assert source.poll() == []
    source.close()
    source.close()
    assert source.poll() == []


def test_cuda_snapshot_survives_the_wire(tmp_path: Path, hooks) -> None:
    pid = os.getpid()
    hook = hooks()
    snap = replace(make_snapshot(pid, 1), cuda=CudaMemory(10, 20, 15, 0, 0))
    with AnatomySource(tmp_path) as source:
        source.poll()
        hook.send_msg(make_hello(pid))
        hook.send_msg(snap)
        (proc,) = poll_until(source, lambda ps: bool(ps) and ps[0].snapshot is not None)
    assert proc.snapshot == snap


def test_monitor_side_modules_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, tui.demo, tui.sources.anatomy_source, tui.sources.reconcile, "
        "tui.report.anatomy_text, tui.report.anatomy_json; "
        "print(sorted(m for m in ('torch', 'transformers', 'textual') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
