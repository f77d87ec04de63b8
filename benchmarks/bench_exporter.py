"""The cost of one Prometheus scrape of ``anatomy-top exporter`` on a busy node: 8 GPUs, 64 GPU processes,
8 of them training ranks publishing their anatomy.

The box is the simulated NVML under unmodified pynvml (``tui.simnvml``), its 64 processes real local
ones: 8 ranks, each its own process serving the hook's real ``Publisher`` on the real wire protocol and
publishing a fresh snapshot every 0.5 s (as a hook does) with every component, CUDA allocator figures and
five op groups; and 56 sleepers.

Two measurements, each against a baseline taken in the same run, rounds interleaved:

1. in-process, one scrape = ``NodeCollector.scrape()`` + the text exposition (``generate_latest``),
   against the monitor's refresh of the same sources (``NvmlSource.query()`` with the TUI's cache
   tiers + ``AnatomySource.poll()``). NVML calls of each, counted by the simulated library itself and
   checked against what the exporter reports about itself (``anatomy_exporter_nvml_calls``).
2. over HTTP, what Prometheus sees: ``GET /metrics`` (gzip, as Prometheus asks) from a running
   ``anatomy-top exporter`` process, wall time and the exporter's CPU time per scrape, against
   ``GET /`` on the same server (the HTTP floor: connection, thread, headers).

Also printed: the series one scrape holds, by family, and the arithmetic for 1,000 such nodes.

    .venv/bin/python benchmarks/bench_exporter.py [--rounds 40] [--gpus 8] [--processes 64] [--ranks 8]
        [--json out.json]

Figures taken on a loaded machine are noisy: compare ratios, and re-run on a quiet box for absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

from prometheus_client import generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from anatomy.protocol import CudaMemory, Hello, OpGroupStat, Snapshot, Timing, encode  # noqa: E402
from anatomy.vocabulary import Component, OpGroup  # noqa: E402
from tui import simnvml  # noqa: E402
from tui.exporter.collector import NodeCollector  # noqa: E402
from tui.exporter.server import build_registry  # noqa: E402
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
    ours_calls: list[int] = []
    base_calls: list[int] = []
    reported: list[int] = []
    text = b""
    for i in range(rounds):
        time.sleep(0.25)  # publishers push between scrapes, as they do between real ones
        order = ("ours", "base") if i % 2 == 0 else ("base", "ours")
        for which in order:
            before = lib.total_calls
            if which == "ours":
                t0 = time.perf_counter()
                text = generate_latest(registry)
                ours.append(time.perf_counter() - t0)
                ours_calls.append(lib.total_calls - before)
                assert collector.last is not None
                reported.append(collector.last.nvml_calls)
            else:
                t0 = time.perf_counter()
                monitor_nvml.query()
                monitor_hooks.poll()
                base.append(time.perf_counter() - t0)
                base_calls.append(lib.total_calls - before)
    collector.close()
    monitor_nvml.close()
    monitor_hooks.close()
    assert ours_calls == reported, (
        f"the exporter's own NVML count disagrees with the library's: {reported} vs {ours_calls}"
    )
    return {"ours_s": ours, "base_s": base, "ours_calls": ours_calls, "base_calls": base_calls, "text": text}


# ------------------------------------------------------------------------------- 2. over HTTP
def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get(url: str, gz: bool) -> tuple[float, int]:
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gz else {})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def over_http(runtime: Path, scenario: Path, rounds: int) -> dict[str, Any]:
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
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        m = re.search(r"serving (http://\S+)/metrics", line)
        if not m:
            raise RuntimeError(f"exporter did not start: {line}{proc.stderr.read()}")
        base_url = m.group(1)
        for _ in range(3):  # warm-up
            _get(base_url + "/metrics", True)
        scrape_s, floor_s, cpu_s, sizes = [], [], [], []
        plain_size = _get(base_url + "/metrics", False)[1]
        for i in range(rounds):
            time.sleep(0.25)
            order = ("ours", "base") if i % 2 == 0 else ("base", "ours")
            for which in order:
                if which == "ours":
                    c0 = _cpu_s(proc.pid)
                    wall, size = _get(base_url + "/metrics", True)
                    cpu_s.append(_cpu_s(proc.pid) - c0)
                    scrape_s.append(wall)
                    sizes.append(size)
                else:
                    floor_s.append(_get(base_url + "/", True)[0])
        return {
            "scrape_s": scrape_s,
            "floor_s": floor_s,
            "cpu_s": cpu_s,
            "gzip_bytes": sizes,
            "plain_bytes": plain_size,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


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
        scenario_path = tmp / "scenario.json"
        scenario.to_json(scenario_path)
        lib = simnvml.install(scenario)
        stack.callback(simnvml.uninstall)

        a = in_process(runtime, lib, args.rounds)
        b = over_http(runtime, scenario_path, args.rounds)

    families = series_by_family(a["text"])
    total = sum(families.values())
    process_series = sum(v for k, v in families.items() if k.startswith("process_"))
    gpu_series = sum(v for k, v in families.items() if k.startswith("anatomy_gpu_"))
    exporter_series = sum(v for k, v in families.items() if k.startswith("anatomy_exporter_"))
    rank_series = total - process_series - gpu_series - exporter_series

    med = statistics.median
    print(
        f"box: {args.gpus} simulated GPUs, {args.processes} GPU processes, {args.ranks} publishing ranks; "
        f"{args.rounds} rounds each, interleaved"
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
        "(the exporter re-reads the slow tier every scrape; the monitor caches it 5 s)"
    )
    print("\n2. over HTTP, what Prometheus sees (ms)  median      p95      min")
    for name, vals in (("GET / (HTTP floor) [base]", b["floor_s"]), ("GET /metrics (gzip)", b["scrape_s"])):
        print(f"   {name:36} {ms(med(vals))} {ms(pct(vals, 0.95))} {ms(min(vals))}")
    # /proc counts CPU in clock ticks (10 ms): one scrape's delta is 0 or 1 tick, their mean is unbiased.
    print(f"   {'exporter CPU per scrape (mean)':36} {ms(statistics.fmean(b['cpu_s']))}")
    print(
        f"   ratio /metrics / floor: {med(b['scrape_s']) / med(b['floor_s']):.2f}x; "
        f"body {med(b['gzip_bytes']) / 1024:.1f} KiB gzip, {b['plain_bytes'] / 1024:.1f} KiB plain"
    )
    fixed = exporter_series + process_series
    per_gpu = gpu_series / max(args.gpus, 1)
    per_rank = rank_series / max(args.ranks, 1)
    print(
        f"\n3. series per scrape: {total} = {gpu_series} GPU + {rank_series} rank + {fixed} exporter/process"
    )
    print(f"   per node: {per_gpu:g} x GPUs + {per_rank:g} x ranks + {fixed}")
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
