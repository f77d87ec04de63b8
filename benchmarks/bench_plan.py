"""Benchmark of `anatomy-top plan` and the advisor.

Prints, for the scale targets (BERT-large batch 4 x 512 in < 1 s, a 7B Llama in < 10 s, process
memory growing < 500 MB; T5-base and ViT-base plan times for the other tasks):
  * plan time, cold (first plan in the process: FakeTensorMode warms up) and warm, and the peak RSS
    growth the plans caused;
  * the ratio of the default (depth-extrapolated) plan to the exact full-depth run of the same model,
    measured in the same run, with both results (they must agree);
  * the technique table + largest-batch search time;
  * advise() per call, against protocol.encode of the same snapshot (what the hook pays per publish);
  * first (``--walls`` alone): the whole process's wall time of ``anatomy-top plan BERT_LARGE_DIR --quick``
    against accelerate's weights-only estimate of the same local config (``accelerate estimate-memory``'s
    own code: a local directory fails its hub check, so the snippet below runs the rest of it) and the
    floor both stand on, ``import torch, transformers``: the three run round by round (7 rounds, or
    ``--rounds N``), and the ratios are taken within each round (the machine's load moves all three
    alike) — medians and their min-max, for wall time and for CPU time (user + system).

Run: .venv/bin/python benchmarks/bench_plan.py [--walls] [--rounds N]
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psutil


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _timed(fn, repeat: int = 1):  # type: ignore[no-untyped-def]
    best = float("inf")
    out = None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


REPO = Path(__file__).resolve().parents[1]
# `accelerate estimate-memory MODEL --library_name transformers --dtypes float32` on a local config: its
# create_empty_model without the hub lookup (verify_on_hub fails offline and for a directory), then its
# own size arithmetic and table.
ACCELERATE = """
import sys, torch
from transformers import AutoConfig, AutoModel
from accelerate import init_empty_weights
from accelerate.commands.estimate import estimate_training_usage
from accelerate.utils import calculate_maximum_sizes, convert_bytes
config = AutoConfig.from_pretrained(sys.argv[1])
with init_empty_weights():
    model = AutoModel.from_config(config, torch_dtype=torch.float32)
total, largest = calculate_maximum_sizes(model)
usage = estimate_training_usage(total, "float32")
print("float32", convert_bytes(largest[0]), convert_bytes(total), convert_bytes(max(usage.values())))
"""


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def process_walls(rounds: int = 7) -> None:
    """Wall time of whole processes, interleaved round by round: each round runs the plan, accelerate's
    estimate and the floor once each (their order rotating, so none always follows another), and the
    ratios are taken within a round, where the machine's load is the same for all three. Prints the
    medians and, for each ratio, its median and the spread (min-max) over the rounds."""
    from transformers import BertConfig

    with tempfile.TemporaryDirectory() as tmp:
        BertConfig(
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=16,
            intermediate_size=4096,
            architectures=["BertForSequenceClassification"],
        ).save_pretrained(tmp)
        py = sys.executable
        commands = {
            "plan --quick": [py, "-m", "tui.cli", "plan", tmp, "--quick"],
            "accelerate": [py, "-c", ACCELERATE, tmp],
            "floor": [py, "-c", "import torch, transformers"],
        }
        env = dict(os.environ, PYTHONPATH=str(REPO))
        names = list(commands)
        walls: dict[str, list[float]] = {name: [] for name in names}
        cpus: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                done = subprocess.run(commands[name], cwd=REPO, env=env, capture_output=True, text=True)
                wall = time.perf_counter() - t
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if done.returncode != 0:
                    raise SystemExit(f"{name} failed: {done.stderr[-2000:]}")
                walls[name].append(wall)
                cpus[name].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    plan, acc, floor = walls["plan --quick"], walls["accelerate"], walls["floor"]

    def ratio(a: list[float], b: list[float]) -> str:
        per = [x / y for x, y in zip(a, b, strict=True)]
        return f"{_median(per):.2f}x ({min(per):.2f}-{max(per):.2f})"

    print(f"Whole process, BERT-large local config ({rounds} interleaved rounds; medians, ratios' min-max):")
    print(
        f"  anatomy-top plan --quick {_median(plan):.2f} s, accelerate's estimate {_median(acc):.2f} s, "
        f"import torch, transformers {_median(floor):.2f} s"
    )
    faster = sum(p <= a for p, a in zip(plan, acc, strict=True))
    print(
        f"  plan / accelerate {ratio(plan, acc)} (target <= 1.0); plan <= accelerate in {faster} of "
        f"{rounds} rounds"
    )
    print(f"  plan / floor {ratio(plan, floor)}, accelerate / floor {ratio(acc, floor)}")
    print(
        f"  beyond the floor: plan +{_median([p - f for p, f in zip(plan, floor, strict=True)]):.2f} s, "
        f"accelerate +{_median([a - f for a, f in zip(acc, floor, strict=True)]):.2f} s"
    )
    # CPU time (user + system) moves less with the machine's load than wall time does.
    p_cpu, a_cpu, f_cpu = cpus["plan --quick"], cpus["accelerate"], cpus["floor"]
    print(
        f"  CPU time: plan {_median(p_cpu):.2f} s, accelerate {_median(a_cpu):.2f} s, floor "
        f"{_median(f_cpu):.2f} s; plan / accelerate {ratio(p_cpu, a_cpu)}"
    )


def main() -> None:
    args = sys.argv[1:]
    process_walls(int(args[args.index("--rounds") + 1]) if "--rounds" in args else 7)
    if "--walls" in args:
        return
    import transformers
    from transformers import BertConfig, LlamaConfig

    from anatomy.plan import Planner, PlanSettings, largest_batch, technique_table
    from anatomy.vocabulary import Component, Precision

    transformers.logging.set_verbosity_error()
    mib = 1 << 20
    bert = BertConfig(
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        architectures=["BertForSequenceClassification"],
    )
    settings = PlanSettings(batch_size=4, seq_len=512)
    rss0, max0 = _rss(), _maxrss()

    cold, _ = _timed(lambda: Planner(bert, name="bert-large").plan(settings))
    warm, result = _timed(lambda: Planner(bert, name="bert-large").plan(settings), repeat=3)
    exact, full = _timed(lambda: Planner(bert, name="bert-large").plan(replace(settings, exact_depth=True)))
    act, act_full = result.components[Component.ACTIVATIONS], full.components[Component.ACTIVATIONS]
    print("BERT-large (335 M params), batch 4 x seq 512, fp32 AdamW, CUDA target")
    print(f"  plan cold {cold:.2f} s, warm {warm:.2f} s (target < 1 s)")
    print(
        f"  exact full-depth run {exact:.2f} s: extrapolated/exact time ratio {warm / exact:.2f}; "
        f"activations {act / mib:.1f} vs {act_full / mib:.1f} MiB, peak {result.peak_bytes / mib:.1f} vs "
        f"{full.peak_bytes / mib:.1f} MiB"
    )
    print(
        f"  predicted: peak {result.peak_bytes / mib:.0f} MiB ({result.peak_phase.value}), "
        f"total {result.total_bytes / mib:.0f} MiB"
    )

    planner = Planner(bert, name="bert-large")
    table_s, rows = _timed(lambda: technique_table(planner, settings, "V100-16GB"))
    batch_s, batch = _timed(lambda: largest_batch(planner, settings, "V100-16GB"))
    print(
        f"  technique table ({len(rows)} rows) {table_s:.2f} s; "
        f"largest batch {batch.batch_size} in {batch_s:.2f} s"
    )

    llama = LlamaConfig(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
    )
    l_settings = PlanSettings(batch_size=1, seq_len=2048, precision=Precision.BF16_MIXED)
    l_time, l_res = _timed(lambda: Planner(llama, "causal-lm", name="llama-7b").plan(l_settings))
    print("Llama-7B-style (6.74 B params), batch 1 x seq 2048, bf16 mixed AdamW")
    print(
        f"  plan {l_time:.2f} s (target < 10 s); peak {l_res.peak_bytes / (1 << 30):.1f} GiB "
        f"({l_res.peak_phase.value}), total {l_res.total_bytes / (1 << 30):.1f} GiB"
    )
    from transformers import T5Config, ViTConfig

    t5 = T5Config(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12, decoder_start_token_id=0)
    t5_settings = PlanSettings(batch_size=8, seq_len=512, target_len=128, precision=Precision.BF16_MIXED)
    t5_time, t5_res = _timed(lambda: Planner(t5, name="t5-base").plan(t5_settings))
    vit = ViTConfig()  # ViT-base/16 at 224 px
    vit_settings = PlanSettings(batch_size=64, precision=Precision.BF16_MIXED)
    vit_time, vit_res = _timed(lambda: Planner(vit, name="vit-base").plan(vit_settings))
    print(
        f"T5-base ({t5_res.parameter_count / 1e6:.0f} M), batch 8 x 512 -> 128 tokens, bf16, padded: plan "
        f"{t5_time:.2f} s, peak {t5_res.peak_bytes / (1 << 30):.2f} GiB, KV cache "
        f"{t5_res.kv_cache_bytes / mib:.0f} MiB; ViT-base/16, batch 64 x 224 px, bf16: plan "
        f"{vit_time:.2f} s, peak {vit_res.peak_bytes / (1 << 30):.2f} GiB"
    )
    print(
        f"Process memory: RSS grew {(_rss() - rss0) / mib:.0f} MB, peak RSS grew "
        f"{(_maxrss() - max0) / mib:.0f} MB over all plans above (target < 500 MB)"
    )

    from anatomy import protocol
    from anatomy.advisor import advise

    hello = protocol.Hello(
        pid=1,
        host="h",
        device="cuda:0",
        precision="fp32",
        optimizer="adamw",
        model_class="M",
        parameter_count=10**9,
        torch_version="x",
        started_at=0.0,
        device_name="NVIDIA A100-SXM4-80GB",
        device_memory_bytes=80 << 30,
        vocab_size=50257,
    )
    history = []
    for i in range(1, 65):
        cuda = protocol.CudaMemory(
            allocated=(18 << 30) + i * (100 << 20),
            reserved=78 << 30,
            peak_allocated=75 << 30,
            alloc_retries=1,
            ooms=0,
        )
        history.append(
            protocol.Snapshot(
                pid=1,
                seq=i,
                time=float(i),
                step=i,
                memory={c.value: 10 << 30 for c in Component},
                expected_bytes_per_param={},
                parameter_count=10**9,
                peak_bytes=75 << 30,
                peak_phase="backward",
                cuda=cuda,
                batch_size=12,
            )
        )
    snap = history[-1]
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        out = advise(hello, snap, history[:-1])
    per_advise = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        protocol.encode(replace(snap, suggestions=out))
    per_encode = (time.perf_counter() - t) / n
    print(
        f"advise(): {per_advise * 1e6:.0f} us/call with 64 snapshots of history and {len(out)} suggestions "
        f"(target < 1 ms); protocol.encode of the same snapshot {per_encode * 1e6:.0f} us: ratio "
        f"{per_advise / per_encode:.2f}"
    )


if __name__ == "__main__":
    main()
