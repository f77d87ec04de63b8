"""Per-step overhead of the anatomy hook on a CPU training loop.

One interleaved run: two identical small BERTs (same weights, same batch), one tracked at default
settings (publishing, with a reader connected), one not. Blocks of steps alternate between them so
that load from anything else on the machine hits both alike; warm-up steps are excluded. Printed:

- the median step time with the hook + reader vs without (target <= 1.01x), on steps that did not
  run the op-group profiler;
- the sampled op-group step's extra time and that cost amortized over ``sample_every`` steps;
- the all-in ratio (every step, profiled ones included).

Usage: python benchmarks/bench_hook_overhead.py [--blocks 30] [--block-steps 5] [--layers 4]
Runs in about a minute on a 2-core machine.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch


def build(layers: int, hidden: int, seed: int = 0) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        intermediate_size=4 * hidden,
        attn_implementation="eager",
    )
    return BertForSequenceClassification(cfg)


def reader_thread(directory: Path, stop: threading.Event, received: list[int]) -> threading.Thread:
    """A monitor's reader: connects when the socket appears and drains it continuously."""
    from anatomy import protocol

    def run() -> None:
        reader = None
        while reader is None and not stop.is_set():
            found = protocol.discover(directory)
            if found:
                reader = protocol.Reader(found[0])
            else:
                time.sleep(0.01)
        if reader is None:
            return
        with reader:
            while not stop.is_set() and not reader.closed:
                if reader.poll() and reader.snapshot is not None:
                    received.append(reader.snapshot.step)
                time.sleep(0.05)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=24, help="interleaved blocks")
    ap.add_argument("--block-steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared box)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--sample-every", type=int, default=50, help="the tracker's default is 50")
    args = ap.parse_args()

    directory = Path(tempfile.mkdtemp(prefix="anatomy-bench-"))
    os.environ["ANATOMY_TOP_DIR"] = str(directory)
    import anatomy

    g = torch.Generator().manual_seed(1)
    batch = {
        "input_ids": torch.randint(100, 30000, (args.batch, args.seq), generator=g),
        "labels": torch.randint(0, 2, (args.batch,), generator=g),
    }
    torch.set_num_threads(args.threads)
    plain = build(args.layers, args.hidden)
    hooked = build(args.layers, args.hidden)
    sampled = build(args.layers, args.hidden)
    opts = {
        name: torch.optim.AdamW(m.parameters())
        for name, m in (("plain", plain), ("hooked", hooked), ("sampled", sampled))
    }
    models = {"plain": plain, "hooked": hooked, "sampled": sampled}
    # The arm under test: default settings, publishing, a reader connected.
    tracker = anatomy.track(hooked, opts["hooked"], sample_every=args.sample_every)
    # The profiled-step arm: the op-group profiler on every step (sample_every=1), not published.
    profiling = anatomy.track(sampled, opts["sampled"], sample_every=1, publish=False)
    trackers = {"hooked": tracker, "sampled": profiling}
    stop = threading.Event()
    received: list[int] = []
    reader = reader_thread(directory, stop, received)
    index = {"hooked": 0, "sampled": 0}

    def one_step(name: str) -> float:
        model, opt = models[name], opts[name]
        t0 = time.perf_counter()
        with trackers[name].step() if name in trackers else contextlib.nullcontext():
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
        dt = time.perf_counter() - t0
        if name in index:
            index[name] += 1
        return dt

    def profiled(i: int) -> bool:
        return args.sample_every > 0 and (i == 1 or i % args.sample_every == 0)

    for _ in range(args.warmup):  # excluded: optimizer state allocation, allocator warm-up
        for name in models:
            one_step(name)
    times: dict[str, list[float]] = {name: [] for name in models}
    started = time.perf_counter()
    for block in range(args.blocks):
        # plain and hooked every block (order alternating), the profiled arm every third block
        order = ["plain", "hooked"] if block % 2 == 0 else ["hooked", "plain"]
        if block % 3 == 0:
            order.append("sampled")
        for name in order:
            for _ in range(args.block_steps):
                i = index.get(name, 0)
                dt = one_step(name)
                if name == "hooked" and profiled(i):
                    continue  # a profiled step of the default arm: counted via the profiled arm
                times[name].append(dt)
    elapsed = time.perf_counter() - started
    stop.set()
    reader.join(timeout=5)
    snap = tracker.latest
    tracker.close()
    profiling.close()

    base = statistics.median(times["plain"])
    hooked_med = statistics.median(times["hooked"])
    sampled_med = statistics.median(times["sampled"])
    extra = sampled_med - hooked_med
    amortized = extra / args.sample_every if args.sample_every > 0 else 0.0
    all_in = (hooked_med + amortized) / base
    n_params = sum(p.numel() for p in plain.parameters()) / 1e6
    print(
        f"model: BERT {args.layers}x{args.hidden}, batch {args.batch}x{args.seq}, {n_params:.1f} M params, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(
        f"steps: {len(times['plain'])} plain, {len(times['hooked'])} hooked, "
        f"{len(times['sampled'])} profiled, "
        f"interleaved in blocks of {args.block_steps}; {elapsed:.1f} s; "
        f"reader received {len(received)} snapshots"
    )
    print(f"plain step (median)              : {base * 1e3:8.2f} ms")
    print(
        f"hooked + reader step (median)    : {hooked_med * 1e3:8.2f} ms   ratio {hooked_med / base:.4f}x "
        "(target <= 1.01x)"
    )
    mean_ratio = statistics.fmean(times["hooked"]) / statistics.fmean(times["plain"])
    print(f"hooked / plain (means)           : {mean_ratio:.4f}x")
    print(
        f"profiled op-group step (median)  : {sampled_med * 1e3:8.2f} ms   extra {extra * 1e3:.2f} ms "
        f"({sampled_med / hooked_med:.2f}x a hooked step)"
    )
    print(
        f"amortized over sample_every={args.sample_every:<4}: {amortized * 1e3:8.3f} ms/step = "
        f"{amortized / base * 100:.2f}% of a plain step"
    )
    print(f"all-in ratio at default settings : {all_in:.4f}x")
    if snap is not None:
        acts = snap.memory.get("activations")
        print(
            f"last snapshot: step {snap.step}, activations {acts / 2**20 if acts else 0:.1f} MiB, "
            f"error={snap.error!r}"
        )


if __name__ == "__main__":
    main()
