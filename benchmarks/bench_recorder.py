"""The flight recorder's cost to training: the same tracked CPU training loop with the recorder on and off.

Three identical small BERTs (same weights, same batch), each under its own tracker at default settings
(publishing): "recorded" (the recorder on, into a temporary directory), "unrecorded" (record=False) and
"control" (record=False again: the A/A noise floor of this machine). Each round runs one step of each arm
in rotating order, so load from anything else hits all alike. Steps on which the op-group profiler or
the heap trace ran are left out of the ratios (every arm samples the same steps). Printed: recorded /
unrecorded as the median of per-round ratios, the ratio of medians and in training-thread CPU time, each
next to the control's; the record's size per 1,000 steps.

Usage: python benchmarks/bench_recorder.py [--steps 2000] [--layers 1] [--hidden 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from anatomy.hook.schedule import SAMPLE_EVERY, TRACE_EVERY


def build(layers: int, hidden: int, seed: int = 0) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=2000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        intermediate_size=4 * hidden,
        attn_implementation="eager",
    )
    return BertForSequenceClassification(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000, help="steps per arm")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=32)
    args = ap.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="anatomy-bench-rec-"))
    os.environ["ANATOMY_TOP_DIR"] = str(scratch / "rt")
    import anatomy
    from anatomy import runs

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(1)
    batch = {
        "input_ids": torch.randint(100, 1900, (args.batch, args.seq), generator=g),
        "labels": torch.randint(0, 2, (args.batch,), generator=g),
    }
    arms = ["unrecorded", "control", "recorded"]
    models = {name: build(args.layers, args.hidden) for name in arms}
    opts = {name: torch.optim.AdamW(m.parameters()) for name, m in models.items()}
    record_dir = scratch / "runs"
    trackers = {
        name: anatomy.track(models[name], opts[name], record=record_dir if name == "recorded" else False)
        for name in arms
    }
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    wall: dict[str, list[float]] = {name: [] for name in arms}

    def one_step(name: str) -> tuple[float, float]:
        model, opt = models[name], opts[name]
        t0, c0 = time.perf_counter(), time.thread_time()
        with trackers[name].step(samples=args.batch):
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
        return time.perf_counter() - t0, time.thread_time() - c0

    def sampled(i: int) -> bool:  # i: 1-based step count of an arm
        return i == 1 or i % SAMPLE_EVERY == 0 or i % (SAMPLE_EVERY * TRACE_EVERY) == 0

    for _ in range(args.warmup):
        for name in arms:
            one_step(name)
    ratios: dict[str, list[float]] = {"recorded": [], "control": []}
    started = time.perf_counter()
    for r in range(args.steps):
        order = arms[r % 3 :] + arms[: r % 3]
        this: dict[str, float] = {}
        for name in order:
            dt, dc = one_step(name)
            if not sampled(args.warmup + r + 1):
                wall[name].append(dt)
                cpu[name].append(dc)
                this[name] = dt
        if this:
            for name in ("recorded", "control"):
                ratios[name].append(this[name] / this["unrecorded"])
    elapsed = time.perf_counter() - started
    for t in trackers.values():
        t.close()

    med = {name: statistics.median(v) for name, v in wall.items()}
    cmed = {name: statistics.median(v) for name, v in cpu.items()}
    files = runs.record_files(record_dir)
    size = sum(p.stat().st_size for p in files)
    run = runs.read_run(files[0]) if files else None
    n_params = sum(p.numel() for p in models["recorded"].parameters()) / 1e6
    print(
        f"model: BERT {args.layers}x{args.hidden}, batch {args.batch}x{args.seq}, {n_params:.2f} M params, "
        f"torch threads {torch.get_num_threads()}; {args.steps} steps per arm in {elapsed:.1f} s"
    )
    print(
        f"step time (median): unrecorded {med['unrecorded'] * 1e3:.3f} ms | control "
        f"{med['control'] * 1e3:.3f} ms | recorded {med['recorded'] * 1e3:.3f} ms"
    )
    print(
        f"recorded / unrecorded, median of per-round ratios: {statistics.median(ratios['recorded']):.4f}x"
        f"   (A/A control: {statistics.median(ratios['control']):.4f}x; target <= 1.01x)"
    )
    print(
        f"recorded / unrecorded, ratio of medians          : {med['recorded'] / med['unrecorded']:.4f}x"
        f"   (A/A control: {med['control'] / med['unrecorded']:.4f}x)"
    )
    print(
        f"training-thread CPU time ratio                   : {cmed['recorded'] / cmed['unrecorded']:.4f}x"
        f"   (A/A control: {cmed['control'] / cmed['unrecorded']:.4f}x)"
    )
    if run is not None:
        steps = sum(r.n for r in run.rows)
        print(
            f"record: {size / 1024:.1f} KiB for {steps} steps and {len(run.snapshots)} snapshots "
            f"= {size / max(steps, 1) * 1000 / 1024:.1f} KiB per 1,000 steps ({elapsed:.0f} s of training); "
            f"ended: {run.ended}"
        )


if __name__ == "__main__":
    main()
