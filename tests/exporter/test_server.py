"""``anatomy-top exporter`` as a user runs it: the listen address, the HTTP endpoint, the warnings and errors,
a clean stop on SIGTERM, and `promtool check metrics` on what it serves."""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tui import simnvml
from tui.exporter.collector import NodeCollector
from tui.exporter.server import (
    DEFAULT_PORT,
    MISSING_EXTRA,
    beyond_loopback,
    build_registry,
    make_app,
    make_server,
    parse_listen,
)

REPO = Path(__file__).resolve().parents[2]
EXPORTER = [sys.executable, "-m", "tui.cli", "exporter"]


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("127.0.0.1:9500", "127.0.0.1", 9500),
        ("localhost:0", "localhost", 0),
        ("[::1]:9443", "::1", 9443),
        (":9443", "0.0.0.0", 9443),  # as Go exporters read it: every interface
        ("9501", "127.0.0.1", 9501),  # a bare port stays on loopback
    ],
)
def test_listen_addresses(text: str, host: str, port: int) -> None:
    address = parse_listen(text)
    assert (address.host, address.port) == (host, port)


@pytest.mark.parametrize("text", ["127.0.0.1:99999", "host:port", "1.2.3.4:", "[::1]9443", "a:b:c", ""])
def test_bad_listen_addresses_are_usage_errors(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_listen(text)


def test_loopback_is_told_apart() -> None:
    assert (
        not beyond_loopback("127.0.0.1") and not beyond_loopback("::1") and not beyond_loopback("localhost")
    )
    assert beyond_loopback("0.0.0.0") and beyond_loopback("::") and beyond_loopback("10.1.2.3")
    assert beyond_loopback("no-such-host.invalid")  # unresolvable: assume the worst


def _env(runtime: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANATOMY_TOP")}
    env.update(ANATOMY_TOP_DIR=str(runtime), PYTHONPATH=str(REPO), **extra)
    return env


@pytest.fixture
def exporter(runtime: Path) -> Iterator[Callable[..., tuple[subprocess.Popen[str], str]]]:
    """``start(*args)`` → the running exporter and the URL it printed."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [*EXPORTER, *args],
            cwd=REPO,
            env=_env(runtime),
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        procs.append(proc)
        assert proc.stderr is not None
        lines = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"serving (http://\S+/metrics)", line)
            if m:
                return proc, m.group(1)
        raise AssertionError(f"no 'serving' line: {lines}")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def test_serves_metrics_on_loopback_and_stops_on_sigterm(
    exporter: Callable[..., Any],
    runtime: Path,
    publishers: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    parse: Callable[..., Any],
) -> None:
    publishers(runtime, make_hello(os.getpid(), rank=0, run_id="srv"), make_snapshot(os.getpid()))
    proc, url = exporter("--listen", "127.0.0.1:0")
    assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/metrics")
    status, ctype, body = _get(url)
    assert status == 200 and ctype.startswith("text/plain")
    series = parse(body)
    assert (
        series[
            ("anatomy_memory_bytes", frozenset({("run_id", "srv"), ("rank", "0"), ("component", "weights")}))
        ]
        == 6e6
    )
    assert _get(url.removesuffix("metrics"))[0] == 200
    assert _get(url.removesuffix("metrics") + "nope")[0] == 404
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert "Traceback" not in proc.stderr.read()


def test_beyond_loopback_prints_one_warning_line(runtime: Path) -> None:
    proc = subprocess.Popen(
        [*EXPORTER, "--listen", "0.0.0.0:0"],
        cwd=REPO,
        env=_env(runtime),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first, second = proc.stderr.readline(), proc.stderr.readline()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    assert first.startswith("anatomy-top exporter: warning: listening on 0.0.0.0:0, beyond loopback")
    assert "serving http://0.0.0.0:" in second
    out = subprocess.run(
        [*EXPORTER, "--listen", "0.0.0.0:0", "--once"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(runtime),
    )
    assert out.returncode == 0 and out.stderr == "", "--once opens no port: nothing to warn about"


def test_a_taken_port_is_one_line_and_exit_1(runtime: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        out = subprocess.run(
            [*EXPORTER, "--listen", f"127.0.0.1:{port}"],
            cwd=REPO,
            env=_env(runtime),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        f"anatomy-top exporter: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


def test_bad_listen_is_a_usage_error(runtime: Path) -> None:
    out = subprocess.run(
        [*EXPORTER, "--listen", "nowhere"],
        cwd=REPO,
        env=_env(runtime),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "expected HOST:PORT" in out.stderr


def test_without_the_extra_it_says_what_to_install(runtime: Path) -> None:
    # prometheus_client made unimportable, as in an install without the 'exporter' extra.
    code = (
        "import sys; sys.modules['prometheus_client'] = None; "
        "from tui.cli import main; sys.exit(main(['exporter']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=_env(runtime), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1
    assert out.stderr.strip() == MISSING_EXTRA
    assert "pip install 'anatomy-top[exporter]'" in MISSING_EXTRA
    # --help still works without it.
    code = code.replace("['exporter']", "['exporter', '--help']")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=_env(runtime), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and f":{DEFAULT_PORT}" in out.stdout


def test_app_routes(runtime: Path, no_nvml: None) -> None:
    collector = NodeCollector(dirs=[runtime])
    server = make_server(parse_listen("127.0.0.1:0"), make_app(build_registry(collector)))
    import threading

    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        status, _, body = _get(base + "/metrics")
        assert status == 200 and "anatomy_exporter_nvml_up 0.0" in body
        # gzip when asked, as Prometheus asks
        req = urllib.request.Request(base + "/metrics", headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert b"anatomy_exporter_nvml_up 0.0" in gzip.decompress(r.read())
        # OpenMetrics on request, as Prometheus asks for it.
        req = urllib.request.Request(
            base + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
            assert r.read().decode().endswith("# EOF\n")
    finally:
        server.shutdown()
        server.server_close()
        collector.close()


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool not installed (Debian: apt-get install prometheus)"
)
def test_promtool_check_metrics_is_clean(
    runtime: Path,
    ranks: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    sim: Callable[..., Any],
) -> None:
    from tui.exporter.text_format import generate_latest  # what /metrics and --once write
    from tui.simnvml.processes import sleepers

    pids = [
        ranks(runtime, make_hello(0, rank=r, world_size=2, run_id="lint"), make_snapshot(0)).pid
        for r in range(2)
    ]
    with sleepers(6, ["python eval.py --x '\"q\"'", *(f"python w.py {i}" for i in range(5))]) as others:
        sim(simnvml.Scenario.demo_box(8, pids=pids + others))
        collector = NodeCollector(dirs=[runtime])
        try:
            collector.scrape(wait_s=1.0)
            text = generate_latest(build_registry(collector))
        finally:
            collector.close()
    assert b"anatomy_memory_bytes{" in text and b"anatomy_gpu_power_watts{" in text
    assert b'gpu_uuid="GPU-' in text
    assert text.count(b"\nanatomy_process_gpu_memory_used_bytes{") == 8  # every GPU process
    assert text.count(b"\nanatomy_process_host_memory_rss_bytes{") == 8
    out = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == b"" and out.stderr.strip() == b"", "promtool found something to say"
