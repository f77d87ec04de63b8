"""The cost of one Prometheus scrape of ``anatomy-top exporter`` on a busy node: 8 GPUs, 64 GPU processes,
8 of them training ranks publishing their anatomy.

The box is the simulated NVML under unmodified pynvml (``tui.simnvml``), its 64 processes real local
ones: 8 ranks, each its own process serving the hook's real ``Publisher`` on the real wire protocol and
publishing a fresh snapshot every 0.5 s (as a hook does) with every component, CUDA allocator figures and
five op groups; and 56 sleepers.

Every NVML call costs ``--latency-us`` (default 50 µs, a realistic cost of a real driver's call; the
simulated library waits that long in each call, ``Scenario.call_latency_us``), so a scrape that makes
more calls than its data needs pays for it as it would on a real node.

Two measurements, each against a baseline taken in the same run, rounds interleaved:

1. in-process, one scrape = ``NodeCollector.scrape()`` + the text exposition (``generate_latest``),
   against the monitor's refresh of the same sources (``NvmlSource.query()`` with the TUI's cache
   tiers + ``AnatomySource.poll()``). NVML calls of each, counted by the simulated library itself and
   checked against what the exporter reports about itself (``anatomy_exporter_nvml_calls``).
2. over HTTP, what Prometheus sees: ``GET /metrics`` from a running ``anatomy-top exporter`` process
   (OpenMetrics, gzip: Prometheus' Accept headers), wall time and the exporter's CPU time per scrape,
   against ``GET /`` on the same server (the HTTP floor: connection, thread, headers) and against
   ``nvitop-exporter`` (the peer, if installed: ``pip install -e .[bench]``) serving the same simulated
   box at the same cost per call. nvitop-exporter collects in a background thread every second and
   serves its last result; ours reads NVML once for each scrape (just before it once scrapes come at a
   steady interval). Both processes run side by side, their scrapes interleaved.

Also printed: the series one scrape holds, by family, and the arithmetic for 1,000 such nodes.

    .venv/bin/python benchmarks/bench_exporter.py [--rounds 40] [--gpus 8] [--processes 64] [--ranks 8]
        [--latency-us 50] [--json out.json]

Figures taken on a loaded machine are noisy: compare ratios, and re-run on a quiet box for absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from anatomy.protocol import CudaMemory, Hello, OpGroupStat, Snapshot, Timing, encode  # noqa: E402
from anatomy.vocabulary import Component, OpGroup  # noqa: E402
from tui import simnvml  # noqa: E402
from tui.exporter.collector import NodeCollector  # noqa: E402
from tui.exporter.server import build_registry  # noqa: E402
from tui.exporter.text_format import generate_latest  # noqa: E402
from tui.simnvml.processes import sleepers  # noqa: E402
from tui.sources.anatomy_source import AnatomySource  # noqa: E402
from tui.sources.nvml import NvmlSource  # noqa: E402

FAKE_RANK = ROOT / "tests" / "exporter" / "fake_rank.py"
NODES = 1000
SCRAPE_INTERVAL_S = 15.0  # Prometheus' default
# Prometheus' head block: roughly 3-4 KiB of memory per active series (its own docs and the usual
# sizing rule); the bench prints the series count, this turns it into a ballpark.
BYTES_PER_HEAD_SERIES = 4096


def make_hello(pid: int, rank: int, ranks: int) -> Hello:
    return Hello(
        pid=pid,
        host="node-0",
        device=f"cuda:{rank % 8}",
        precision="bf16_mixed",
        optimizer="adamw",
        model_class="LlamaForCausalLM",
        parameter_count=8_030_261_248,
        torch_version="2.13.0",
        started_at=time.time(),
        rank=rank,
        local_rank=rank,
        world_size=ranks,
        optimizer_class="AdamW",
        run_id="bench-run",
        local_world_size=ranks,
    )


def make_snapshot(pid: int, seq: int) -> Snapshot:
    gib = 1 << 30
    memory: dict[str, int | None] = {
        Component.CUDA_CONTEXT.value: gib // 2,
        Component.ALLOCATOR_CACHE.value: 3 * gib,
        Component.WEIGHTS.value: 16 * gib,
        Component.OPTIMIZER_STATES.value: 8 * gib,
        Component.GRADIENTS.value: 4 * gib,
        Component.ACTIVATIONS.value: 20 * gib + seq,
        Component.TEMPORARIES.value: gib,
        Component.UNATTRIBUTED.value: 1 << 20,
    }
    at_peak = {k: v for k, v in memory.items() if k not in ("cuda_context", "allocator_cache")}
    return Snapshot(
        pid=pid,
        seq=seq,
        time=time.time(),
        step=seq,
        memory=memory,
        expected_bytes_per_param={"weights": 2.0, "optimizer_states": 1.0, "gradients": 0.5},
        parameter_count=8_030_261_248,
        peak_bytes=sum(v for v in at_peak.values() if v is not None),
        peak_phase="backward",
        memory_source="cuda_allocator",
        cuda=CudaMemory(
            allocated=50 * gib, reserved=53 * gib, peak_allocated=50 * gib, alloc_retries=0, ooms=0
        ),
        timing=Timing(1.2, 0.35, 0.7, 0.1, samples_per_s=53.3, tokens_per_s=218_453.0),
        op_groups={g.value: OpGroupStat(flops=1e14, time_s=0.1) for g in OpGroup},
        op_groups_step=seq,
        achieved_tflops=410.0,
        mfu=0.41,
        at_peak=at_peak,
        at_peak_step=seq,
    )


class Ranks:
    """``n`` ranks, each its own process serving the hook's Publisher (tests/exporter/fake_rank.py) and
    republishing a fresh snapshot every ``interval_s``, as a hook does each step."""

    def __init__(self, directory: Path, n: int, interval_s: float = 0.5) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        for rank in range(n):
            proc = subprocess.Popen(
                [sys.executable, str(FAKE_RANK), str(directory), "--every", str(interval_s)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(encode(make_hello(0, rank, n)) + encode(make_snapshot(0, 0)))
            proc.stdin.flush()
            if not proc.stdout.readline().startswith(b"ready "):
                raise RuntimeError("a fake rank did not start")
            self.procs.append(proc)
        self.pids = [p.pid for p in self.procs]

    def close(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self.procs:
            proc.wait(timeout=10)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def ms(x: float) -> str:
    return f"{x * 1000:8.2f}"


# ------------------------------------------------------------------------------- 1. in-process
def in_process(runtime: Path, lib: Any, rounds: int) -> dict[str, Any]:
    collector = NodeCollector(dirs=[runtime])
    registry = build_registry(collector)
    monitor_nvml = NvmlSource()  # the TUI's tiers: slow fields every 5 s, the rest every refresh
    monitor_hooks = AnatomySource(runtime)
    collector.scrape(wait_s=2.0)
    monitor_hooks.poll(wait_for_first_s=2.0)
    monitor_nvml.query()
    ours: list[float] = []
    base: list[float] = []
    base_calls: list[int] = []
    reported: list[int] = []
    ahead: list[bool] = []
    text = b""
    library_before = lib.total_calls
    for i in range(rounds):
        time.sleep(0.25)  # publishers push between scrapes, as they do between real ones
        order = ("ours", "base") if i % 2 == 0 else ("base", "ours")
        for which in order:
            if which == "ours":
                t0 = time.perf_counter()
                text = generate_latest(registry)
                ours.append(time.perf_counter() - t0)
                assert collector.last is not None
                reported.append(collector.last.nvml_calls)
                ahead.append(collector.last.nvml_age_s > 0)
            else:
                t0 = time.perf_counter()
                reading = monitor_nvml.query()
                monitor_hooks.poll()
                base.append(time.perf_counter() - t0)
                base_calls.append(reading.calls)
    collector.close()  # a read for a scrape that never comes is counted (and waited for) here
    library_calls = lib.total_calls - library_before
    monitor_nvml.close()
    monitor_hooks.close()
    # The library counts every call: the exporter's (made at the scrape, or ahead of it) are what it
    # says it made, plus at most the reads ahead of a scrape that came too late (or never).
    exporter_calls = library_calls - sum(base_calls)
    wasted = exporter_calls - sum(reported)
    assert 0 <= wasted <= max(reported) * (1 + stale_reads(collector)), (
        f"the exporter's own NVML count disagrees with the library's: {sum(reported)} vs {exporter_calls}"
    )
    ours_calls = [exporter_calls / rounds]
    return {
        "ours_s": ours,
        "base_s": base,
        "ours_calls": ours_calls,
        "base_calls": base_calls,
        "read_ahead": sum(ahead),
        "text": text,
    }


def stale_reads(collector: NodeCollector) -> int:
    ahead = getattr(collector, "_ahead", None)
    return int(getattr(ahead, "stale", 0))


# ------------------------------------------------------------------------------- 2. over HTTP
def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# What Prometheus 2.x sends: OpenMetrics first, the text format as a fallback.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)


def _get(url: str, gz: bool) -> tuple[float, int]:
    """``gz``: as Prometheus asks (OpenMetrics, gzip); else the plain text format."""
    req = urllib.request.Request(
        url, headers={"Accept-Encoding": "gzip", "Accept": PROMETHEUS_ACCEPT} if gz else {}
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _nvitop_exporter() -> str | None:
    script = Path(sys.executable).parent / "nvitop-exporter"
    return str(script) if script.exists() else shutil.which("nvitop-exporter")


def start_nvitop(scenario: Path, calls_out: Path) -> tuple[subprocess.Popen[str], str] | None:
    """nvitop-exporter against the same simulated library (``tui.simnvml.run``), or None if not installed."""
    script = _nvitop_exporter()
    if script is None:
        return None
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tui.simnvml.run",
            "--scenario",
            str(scenario),
            "--calls-out",
            str(calls_out),
            "--",
            "nvitop-exporter",  # the console script, found next to this interpreter or on PATH
            "--bind-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--hostname",
            "node-0",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nvitop-exporter exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            _get(url + "/metrics", True)
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("nvitop-exporter did not answer within 60 s")


def over_http(runtime: Path, scenario: Path, rounds: int, tmp: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANATOMY_TOP")}
    env.update(ANATOMY_TOP_DIR=str(runtime), ANATOMY_TOP_SIMULATE=str(scenario), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tui.cli", "exporter", "--listen", "127.0.0.1:0"],
        cwd=ROOT,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    peer: tuple[subprocess.Popen[str], str] | None = None
    peer_calls = tmp / "nvitop-calls.json"
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"serving (http://\S+)/metrics", line)
        if not m:
            raise RuntimeError(f"exporter did not start: {line}{proc.stderr.read()}")
        base_url = m.group(1)
        peer = start_nvitop(scenario, peer_calls)
        peer_started = time.monotonic()
        for _ in range(3):  # warm-up
            _get(base_url + "/metrics", True)
            if peer is not None:
                _get(peer[1] + "/metrics", True)
        scrape_s, floor_s, cpu_s, sizes, peer_s, peer_sizes, calls = [], [], [], [], [], [], []
        plain_size = _get(base_url + "/metrics", False)[1]
        kinds = ["ours", "base"] + (["peer"] if peer is not None else [])
        for i in range(rounds):
            time.sleep(0.25)
            for which in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:
                if which == "ours":
                    c0 = _cpu_s(proc.pid)
                    wall, size = _get(base_url + "/metrics", True)
                    cpu_s.append(_cpu_s(proc.pid) - c0)
                    scrape_s.append(wall)
                    sizes.append(size)
                elif which == "peer":
                    assert peer is not None
                    wall, size = _get(peer[1] + "/metrics", True)
                    peer_s.append(wall)
                    peer_sizes.append(size)
                else:
                    floor_s.append(_get(base_url + "/", True)[0])
        for _ in range(3):  # what the exporter says it made, per scrape
            body = urllib.request.urlopen(base_url + "/metrics", timeout=30).read().decode()
            found = re.search(r"^anatomy_exporter_nvml_calls (\S+)$", body, re.M)
            if found:
                calls.append(int(float(found.group(1))))
        peer_elapsed = time.monotonic() - peer_started
        return {
            "scrape_s": scrape_s,
            "floor_s": floor_s,
            "cpu_s": cpu_s,
            "gzip_bytes": sizes,
            "plain_bytes": plain_size,
            "nvml_calls": calls,
            "peer_s": peer_s,
            "peer_gzip_bytes": peer_sizes,
            "peer_elapsed_s": peer_elapsed,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if peer is not None:
            peer[0].send_signal(signal.SIGINT)  # atexit runs: the simulated library writes its call counts
            try:
                peer[0].wait(timeout=30)
            except subprocess.TimeoutExpired:
                peer[0].kill()
                peer[0].wait()


def peer_calls_per_s(path: Path, elapsed_s: float) -> float | None:
    try:
        return float(json.loads(path.read_text())["total"]) / elapsed_s
    except (OSError, ValueError, KeyError):
        return None


# ------------------------------------------------------------------------------- series
def series_by_family(text: bytes) -> Counter[str]:
    counts: Counter[str] = Counter()
    for fam in text_string_to_metric_families(text.decode()):
        counts[fam.name] += len(fam.samples)
    return counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--processes", type=int, default=64)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--latency-us", type=float, default=50.0, help="wall time of each simulated NVML call")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.ranks > args.processes:
        p.error("--ranks cannot exceed --processes (each rank is one of the GPU processes)")

    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-exporter-")))
        runtime = tmp / "run"
        runtime.mkdir(mode=0o700)
        ranks = Ranks(runtime, args.ranks)
        stack.callback(ranks.close)
        others = stack.enter_context(sleepers(args.processes - args.ranks))
        # Round-robin over the GPUs: rank r on GPU r, the other processes spread behind them.
        scenario = simnvml.Scenario.demo_box(args.gpus, pids=ranks.pids + others)
        scenario.call_latency_us = args.latency_us
        scenario_path = tmp / "scenario.json"
        scenario.to_json(scenario_path)
        lib = simnvml.install(scenario)
        stack.callback(simnvml.uninstall)

        a = in_process(runtime, lib, args.rounds)
        b = over_http(runtime, scenario_path, args.rounds, tmp)
        peer_rate = peer_calls_per_s(tmp / "nvitop-calls.json", b["peer_elapsed_s"])

    families = series_by_family(a["text"])
    total = sum(families.values())
    process_series = sum(v for k, v in families.items() if k.startswith("process_"))
    gpu_series = sum(v for k, v in families.items() if k.startswith("anatomy_gpu_"))
    exporter_series = sum(v for k, v in families.items() if k.startswith("anatomy_exporter_"))
    gpu_process_series = sum(v for k, v in families.items() if k.startswith("anatomy_process_"))
    rank_series = total - process_series - gpu_series - exporter_series - gpu_process_series

    med = statistics.median
    print(
        f"box: {args.gpus} simulated GPUs, {args.processes} GPU processes, {args.ranks} publishing ranks; "
        f"{args.rounds} rounds each, interleaved; every NVML call takes {args.latency_us:g} µs"
    )
    print("\n1. in-process (ms)                       median      p95      min   NVML calls")
    rows = [
        ("monitor refresh (NVML + hooks) [base]", a["base_s"], a["base_calls"]),
        ("exporter scrape + exposition", a["ours_s"], a["ours_calls"]),
    ]
    for name, vals, calls in rows:
        print(f"   {name:36} {ms(med(vals))} {ms(pct(vals, 0.95))} {ms(min(vals))}   {med(calls):10.0f}")
    print(
        f"   ratio exporter / monitor: {med(a['ours_s']) / med(a['base_s']):.2f}x time, "
        f"{med(a['ours_calls']) / med(a['base_calls']):.2f}x NVML calls "
        "(each keeps slow fields on their own tier: the monitor 5 s, the exporter "
        f"{NodeCollector.SLOW_TTL_S:g} s); the exporter's NVML calls are all the library counted for it, "
        f"reads ahead included; {a['read_ahead']} of {args.rounds} scrapes had NVML read just before them"
    )
    print("\n2. over HTTP, what Prometheus sees (ms)  median      p95      min")
    http_rows = [
        ("GET / (HTTP floor) [base]", b["floor_s"]),
        ("anatomy-top exporter /metrics", b["scrape_s"]),
    ]
    if b["peer_s"]:
        http_rows.append(("nvitop-exporter /metrics [peer]", b["peer_s"]))
    for name, vals in http_rows:
        print(f"   {name:36} {ms(med(vals))} {ms(pct(vals, 0.95))} {ms(min(vals))}")
    calls_per_scrape = med(b["nvml_calls"]) if b["nvml_calls"] else float("nan")
    if b["peer_s"]:
        print(
            f"   ratio anatomy-top / nvitop-exporter: {med(b['scrape_s']) / med(b['peer_s']):.2f}x "
            f"(body {med(b['gzip_bytes']) / 1024:.1f} vs {med(b['peer_gzip_bytes']) / 1024:.1f} KiB gzip)"
        )
        rate = "?" if peer_rate is None else f"{peer_rate:.0f}"
        print(
            f"   NVML calls: anatomy-top {calls_per_scrape:.0f} per scrape (one read per scrape, "
            "just before it when scrapes are steady); "
            f"nvitop-exporter {rate} per second (in the background, scraped or not)"
        )
    else:
        print(f"   nvitop-exporter is not installed: no peer to compare (NVML calls {calls_per_scrape:.0f})")
    # /proc counts CPU in clock ticks (10 ms): one scrape's delta is 0 or 1 tick, their mean is unbiased.
    print(f"   {'exporter CPU per scrape (mean)':36} {ms(statistics.fmean(b['cpu_s']))}")
    print(
        f"   ratio /metrics / floor: {med(b['scrape_s']) / med(b['floor_s']):.2f}x; "
        f"body {med(b['gzip_bytes']) / 1024:.1f} KiB gzip, {b['plain_bytes'] / 1024:.1f} KiB plain"
    )
    fixed = exporter_series + process_series
    per_gpu = gpu_series / max(args.gpus, 1)
    per_rank = rank_series / max(args.ranks, 1)
    per_process = gpu_process_series / max(args.processes, 1)
    print(
        f"\n3. series per scrape: {total} = {gpu_series} GPU + {gpu_process_series} GPU process + "
        f"{rank_series} rank + {fixed} exporter/process"
    )
    print(
        f"   per node: {per_gpu:g} x GPUs + {per_process:g} x GPU processes (one GPU each) + "
        f"{per_rank:g} x ranks + {fixed}"
    )
    for name, count in families.most_common():
        print(f"   {count:5}  {name}")
    fleet = total * NODES
    head_gib = fleet * BYTES_PER_HEAD_SERIES / 2**30
    print(
        f"\n   {NODES} such nodes: {fleet:,} active series; at a {SCRAPE_INTERVAL_S:g} s interval "
        f"{fleet / SCRAPE_INTERVAL_S:,.0f} samples/s ingested; head block ~{head_gib:.1f} GiB "
        f"at ~{BYTES_PER_HEAD_SERIES // 1024} KiB/series"
    )

    if args.json is not None:
        out = {
            "box": {
                "gpus": args.gpus,
                "processes": args.processes,
                "ranks": args.ranks,
                "rounds": args.rounds,
            },
            "in_process": {k: v for k, v in a.items() if k != "text"},
            "http": b,
            "series": dict(families),
        }
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
