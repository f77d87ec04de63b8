"""Per-step overhead of the anatomy hook on a CPU training loop.

One interleaved run over identical small BERTs (same weights, same batch): "plain" (no hook),
"control" (a second copy without hook: the A/A noise floor of this machine), "hook+reader" (the
tracker at default settings, publishing, with a reader connected) and "sampled" (a tracker whose
every step is a sampled step). Each round runs one step of each, in rotating order, so that load
from anything else on the machine hits all alike; warm-up steps are excluded. Printed:

- hook+reader vs plain (target <= 1.01x) on steps that did not run the op-group profiler, as the
  median of per-round ratios, the ratio of medians, and in training-thread CPU time — each next to
  the same figure for the control;
- the sampled step's extra time, amortized: the op-group profiler runs one step in ``sample_every``,
  the CPU heap trace one in ``sample_every * TRACE_EVERY`` (both measured on an arm that samples
  every step);
- the all-in ratio (every step, profiled ones included).

Usage: python benchmarks/bench_hook_overhead.py [--rounds 120] [--layers 2] [--hidden 128] [--threads 1]
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

from anatomy.hook.schedule import SAMPLE_EVERY


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
    ap.add_argument("--rounds", type=int, default=120, help="rounds of one step per arm")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared box)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument(
        "--sample-every", type=int, default=SAMPLE_EVERY, help=f"the tracker's default is {SAMPLE_EVERY}"
    )
    args = ap.parse_args()

    directory = Path(tempfile.mkdtemp(prefix="anatomy-bench-"))
    os.environ["ANATOMY_TOP_DIR"] = str(directory)
    import anatomy
    from anatomy.hook.schedule import TRACE_EVERY

    g = torch.Generator().manual_seed(1)
    batch = {
        "input_ids": torch.randint(100, 30000, (args.batch, args.seq), generator=g),
        "labels": torch.randint(0, 2, (args.batch,), generator=g),
    }
    torch.set_num_threads(args.threads)
    # plain: the baseline; control: a second untracked copy (the A/A noise floor of this machine);
    # hooked: default settings, publishing, a reader connected; sampled: the profiler on every step.
    models = {name: build(args.layers, args.hidden) for name in ("plain", "control", "hooked", "sampled")}
    opts = {name: torch.optim.AdamW(m.parameters()) for name, m in models.items()}
    tracker = anatomy.track(models["hooked"], opts["hooked"], sample_every=args.sample_every)
    profiling = anatomy.track(models["sampled"], opts["sampled"], sample_every=1, publish=False)
    trackers = {"hooked": tracker, "sampled": profiling}
    stop = threading.Event()
    received: list[int] = []
    reader = reader_thread(directory, stop, received)
    index = {"hooked": 0, "sampled": 0}
    # CPU time of the training thread: immune to other processes' load (the publisher's own
    # thread is not in it: it runs beside training, mostly in system calls).
    cpu: dict[str, list[float]] = {name: [] for name in models}

    def one_step(name: str) -> float:
        model, opt = models[name], opts[name]
        t0, c0 = time.perf_counter(), time.thread_time()
        with trackers[name].step() if name in trackers else contextlib.nullcontext():
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
        dt = time.perf_counter() - t0
        cpu[name].append(time.thread_time() - c0)
        if name in index:
            index[name] += 1
        return dt

    def profiled(i: int) -> bool:
        return args.sample_every > 0 and (i == 1 or i % args.sample_every == 0)

    for _ in range(args.warmup):  # excluded: optimizer state allocation, allocator warm-up
        for name in models:
            one_step(name)
    for name in models:
        cpu[name].clear()
    times: dict[str, list[float]] = {name: [] for name in [*models, "traced"]}
    pair_ratios: dict[str, list[float]] = {"hooked": [], "control": []}
    started = time.perf_counter()
    arms = ["plain", "control", "hooked"]
    for r in range(args.rounds):
        # One step of each arm per round, in rotating order: neighbours in time share the load.
        order = arms[r % 3 :] + arms[: r % 3]
        if r % 2 == 0:
            order.append("sampled")
        this_round: dict[str, float] = {}
        for name in order:
            i = index.get(name, 0)
            dt = one_step(name)
            if name == "hooked" and profiled(i):
                continue  # a profiled step of the default arm: accounted through the sampled arm
            if name == "sampled" and (i == 1 or i % TRACE_EVERY == 0):
                times["traced"].append(dt)  # op groups + the heap trace
                continue
            times[name].append(dt)
            this_round[name] = dt
        for name in ("hooked", "control"):
            if name in this_round:
                pair_ratios[name].append(this_round[name] / this_round["plain"])
    elapsed = time.perf_counter() - started
    stop.set()
    reader.join(timeout=5)
    snap = tracker.latest
    tracker.close()
    profiling.close()

    med = {name: statistics.median(v) for name, v in times.items()}
    base = med["plain"]
    extra = med["sampled"] - med["hooked"]
    extra_trace = med["traced"] - med["sampled"]
    amortized_groups = extra / args.sample_every if args.sample_every > 0 else 0.0
    amortized_trace = extra_trace / (args.sample_every * TRACE_EVERY) if args.sample_every > 0 else 0.0
    amortized = (amortized_groups + amortized_trace) / base
    paired = statistics.median(pair_ratios["hooked"])
    noise = statistics.median(pair_ratios["control"])
    cpu_hooked = [t for i, t in enumerate(cpu["hooked"]) if not profiled(i)]
    cpu_base = statistics.median(cpu["plain"])
    n_params = sum(p.numel() for p in models["plain"].parameters()) / 1e6
    print(
        f"model: BERT {args.layers}x{args.hidden}, batch {args.batch}x{args.seq}, {n_params:.1f} M params, "
        f"torch threads {torch.get_num_threads()}; {args.rounds} rounds of one step per arm, "
        f"{elapsed:.1f} s; "
        f"the reader received {len(received)} snapshots"
    )
    print(
        f"step time (median): plain {base * 1e3:.2f} ms | control {med['control'] * 1e3:.2f} ms | "
        f"hook+reader {med['hooked'] * 1e3:.2f} ms | profiled {med['sampled'] * 1e3:.2f} ms | "
        f"profiled+heap trace {med['traced'] * 1e3:.2f} ms"
    )
    print(f"hook+reader / plain, median of per-round ratios : {paired:.4f}x   (A/A control: {noise:.4f}x)")
    print(
        f"hook+reader / plain, ratio of medians           : {med['hooked'] / base:.4f}x   "
        f"(A/A control: {med['control'] / base:.4f}x)"
    )
    print(
        f"training-thread CPU time ratio                  : {statistics.median(cpu_hooked) / cpu_base:.4f}x "
        "  "
        f"(A/A control: {statistics.median(cpu['control']) / cpu_base:.4f}x)"
    )
    print(
        f"sampled steps: op-group profiler +{extra * 1e3:.2f} ms on 1 step in {args.sample_every}, "
        f"heap trace +{extra_trace * 1e3:.2f} ms on 1 in {args.sample_every * TRACE_EVERY} "
        f"-> amortized {amortized * 100:.2f}% of a plain step"
    )
    print(
        f"all-in at default settings (per-round ratio + amortized sampling): {paired + amortized:.4f}x "
        "(target <= 1.01x)"
    )
    if snap is not None:
        acts = snap.memory.get("activations")
        print(
            f"last snapshot: step {snap.step}, activations {acts / 2**20 if acts else 0:.1f} MiB, "
            f"error={snap.error!r}"
        )


if __name__ == "__main__":
    main()
