"""``anatomy-top exporter``: the command line and the HTTP endpoint.

    anatomy-top exporter                          serve http://127.0.0.1:9443/metrics
    anatomy-top exporter --listen 0.0.0.0:9443    every interface (prints a one-line warning)
    anatomy-top exporter --once                   print one scrape and exit (| promtool check metrics)

prometheus_client (the ``exporter`` extra) is imported only once the command line parsed, so ``--help``
works without it and its absence is one line, not a traceback.
"""

from __future__ import annotations

import argparse
import ipaddress
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from tui.exporter.gpu_processes import MAX_PROCESSES

PROG = "anatomy-top exporter"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9443
METRICS_PATH = "/metrics"
ONCE_WAIT_S = 1.0  # as `anatomy-top --once`: how long to wait for each hook's first snapshot
MISSING_EXTRA = (
    f"{PROG}: prometheus-client is not installed: install the 'exporter' extra "
    "(pip install 'anatomy-top[exporter]')"
)

DESCRIPTION = """\
A Prometheus endpoint for this node: every GPU (NVML) and every training process that publishes
its anatomy through the hook (memory by component, step and phase times, op groups, throughput,
MFU), read at scrape time. Labels match dcgm-exporter's for GPUs (gpu, UUID, hostname)."""

EPILOG = f"""\
examples:
  {PROG}                            serve http://{DEFAULT_HOST}:{DEFAULT_PORT}{METRICS_PATH}
  {PROG} --listen 0.0.0.0:{DEFAULT_PORT}      every interface (for a Prometheus on another host)
  {PROG} --once | promtool check metrics
  {PROG} --dir /run/anatomy-top     also read hooks publishing in /run/anatomy-top/*/ (containers)

Run as an ordinary user it reads that user's training processes; as root, every user's (each socket
must belong to its directory's owner). See docs/cluster.md for Prometheus, Grafana and Kubernetes.
"""


class ListenAddress:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> ListenAddress:
    """``HOST:PORT``, ``[IPV6]:PORT``, ``:PORT`` (every interface, as Go exporters read it) or ``PORT``
    (loopback). argparse type: a bad value is a usage error."""
    text = text.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected [IPV6]:PORT, got {text!r}")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
        host = host or "0.0.0.0"
    elif text.isdigit():
        host, port = DEFAULT_HOST, text
    else:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT}), got {text!r}")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {port!r}")
    if not host:
        raise argparse.ArgumentTypeError(f"empty host in {text!r}")
    return ListenAddress(host, int(port))


def beyond_loopback(host: str) -> bool:
    """Whether binding ``host`` may expose the endpoint to other machines (unresolvable: assume so)."""
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return True
    return any(not ipaddress.ip_address(str(info[4][0]).split("%")[0]).is_loopback for info in infos)


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more: {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--listen",
        type=parse_listen,
        default=ListenAddress(DEFAULT_HOST, DEFAULT_PORT),
        metavar="HOST:PORT",
        help=f"address to serve {METRICS_PATH} on (default {DEFAULT_HOST}:{DEFAULT_PORT}, loopback only)",
    )
    p.add_argument(
        "--dir",
        action="append",
        default=[],
        metavar="DIR",
        help="also read hook sockets in DIR and its subdirectories (repeatable)",
    )
    p.add_argument(
        "--hostname",
        default=None,
        help="the hostname label of GPU series (default: this host's name; dcgm-exporter's, to join)",
    )
    p.add_argument(
        "--max-processes",
        type=_non_negative,
        default=MAX_PROCESSES,
        metavar="N",
        help=f"per-process series for at most N GPU processes, the largest first (default {MAX_PROCESSES})",
    )
    p.add_argument("--once", action="store_true", help="print one scrape (text format) and exit")
    p.add_argument(
        "--demo",
        action="store_true",
        help="a simulated 8-GPU box with a small CPU training job: try it without a GPU",
    )
    return p


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape on stderr is noise in a service's journal


def make_app(registry: Any) -> Callable[..., Any]:
    """/metrics: the registry (content negotiation by prometheus_client; the text format and OpenMetrics
    written by ``text_format``, byte for byte what prometheus_client writes, gzip when asked); /: a
    pointer; else 404."""
    import functools
    import gzip

    from prometheus_client import exposition, make_wsgi_app
    from prometheus_client.openmetrics import exposition as openmetrics

    from tui.exporter import text_format

    metrics = make_wsgi_app(registry)

    def plain_text(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes] | None:
        if environ.get("REQUEST_METHOD") != "GET" or environ.get("QUERY_STRING"):
            return None
        encoder, content_type = exposition.choose_encoder(environ.get("HTTP_ACCEPT") or "")
        if encoder is exposition.generate_latest:  # the text format
            output = text_format.generate_latest(registry)
        elif isinstance(encoder, functools.partial) and encoder.func is openmetrics.generate_latest:
            output = text_format.generate_latest_openmetrics(
                registry, **encoder.keywords
            )  # as Prometheus asks
        else:  # the text format with an escaping scheme asked for: prometheus_client's own
            return None
        headers = [("Content-Type", content_type)]
        if exposition.gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING") or ""):
            # Level 1: a third of level 9's time (prometheus_client's) for a body ~40 % larger, still
            # a tenth of the plain text.
            output = gzip.compress(output, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [output]

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == METRICS_PATH:
            fast = plain_text(environ, start_response)
            return fast if fast is not None else list(metrics(environ, start_response))
        if path in ("", "/"):
            body = f"anatomy-top exporter: metrics at {METRICS_PATH}\n".encode()
            status = "200 OK"
        else:
            body, status = b"not found: the metrics are at /metrics\n", "404 Not Found"
        start_response(
            status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
        )
        return [body]

    return app


def make_server(address: ListenAddress, app: Callable[..., Any]) -> WSGIServer:
    from prometheus_client.exposition import ThreadingWSGIServer

    infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family = infos[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = Server((str(infos[0][4][0]), address.port), _QuietHandler)
    server.set_app(app)
    return server


def build_registry(collector: Any) -> Any:
    from prometheus_client import CollectorRegistry, ProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)  # the exporter's own CPU and memory: what it costs the node
    return registry


def _stderr(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        print(MISSING_EXTRA, file=sys.stderr)
        return 1
    from tui.exporter.collector import NodeCollector
    from tui.exporter.identity import label_value

    stop_demo: Callable[[], None] | None = None
    if args.demo:
        from tui.startup import start_demo

        stop_demo, _ = start_demo(once=True)
    from tui.startup import install_simulation

    nvml_unavailable = install_simulation()
    if nvml_unavailable:
        _stderr(nvml_unavailable)
    hostname = label_value(args.hostname) if args.hostname else None
    collector = NodeCollector(
        dirs=[Path(d).expanduser() for d in args.dir],
        hostname=hostname,
        warn=_stderr,
        max_processes=args.max_processes,
    )
    try:
        registry = build_registry(collector)
        if args.once:
            return _print_once(collector, registry)
        return _serve(args.listen, collector, registry)
    finally:
        collector.close()
        if stop_demo is not None:
            stop_demo()


def _print_once(collector: Any, registry: Any) -> int:
    from tui.exporter.text_format import generate_latest

    collector.scrape(wait_s=ONCE_WAIT_S)  # connect and wait for first snapshots; the print reads again
    try:
        sys.stdout.buffer.write(generate_latest(registry))
        sys.stdout.flush()
    except BrokenPipeError:
        pass
    return 0


def _serve(address: ListenAddress, collector: Any, registry: Any) -> int:
    if beyond_loopback(address.host):
        _stderr(
            f"warning: listening on {address}, beyond loopback: anyone who can reach this host reads its "
            "training metrics (models, hostnames, PIDs); firewall the port or put a TLS proxy in front"
        )
    try:
        server = make_server(address, make_app(registry))
    except OSError as exc:
        _stderr(f"cannot listen on {address}: {exc.strerror or exc}")
        return 1
    first = collector.scrape(wait_s=ONCE_WAIT_S)  # connect to every hook now: the first scrape is whole
    bound = ListenAddress(address.host, server.server_address[1])
    gpus = f"{len(first.gpus)} GPU(s)" if first.nvml.available else f"no GPU ({first.nvml.reason})"
    _stderr(f"serving http://{bound}{METRICS_PATH}: {gpus}, {len(first.ranks)} training process(es)")

    stopping = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not stopping.is_set():
            stopping.set()
            # shutdown() waits for serve_forever to return: it must run on another thread.
            threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        server.server_close()
    return 0
