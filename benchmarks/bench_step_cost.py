"""The hook's fixed cost per step, in microseconds, on a deep tiny model (where a step is short and the
hook's per-step work shows): a 32-block MLP of width 16, batch 4, AdamW, on the CPU.

Interleaved rounds of one step each: "plain" (no hook), "control" (a second copy without hook: the A/A
noise floor) and "hooked" (``tracker.step()`` around each step, default settings, publishing with no
reader). Printed: the median step time of each arm and the hook's cost as the median of per-round
differences (hooked − plain), next to the control's (control − plain), in wall-clock time and in the
training thread's CPU time (which a loaded machine's preemptions do not inflate). Steps that run the op-group
profiler (one in ``sample_every``) are excluded: their cost is the sampled-step figure of
``bench_hook_overhead.py``.

Each step is told its samples, as README's loop tells it (its batch has floats: no tokens), so ordinary
steps leave the forward unwatched; ``--unsized`` tells it nothing: the forward hooks watch every step.

Usage: python benchmarks/bench_step_cost.py [--rounds 3000] [--blocks 32] [--loop micro|update] [--unsized]
``--loop micro`` wraps each of 4 micro-batches in its own ``tracker.step()`` (accelerate's loop shape:
three blocks in four end without an update and join the next step).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import torch


def build(blocks: int, width: int, seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--loop", choices=("update", "micro"), default="update")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--unsized",
        action="store_true",
        help="steps not told their samples: the forward stays watched (the hook reads the batch)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import anatomy

    x = torch.randn(4, args.width)
    arms = {}
    for name in ("plain", "control", "hooked"):
        model = build(args.blocks, args.width)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        arms[name] = (model, opt)
    with tempfile.TemporaryDirectory() as tmp:
        tracker = anatomy.track(*arms["hooked"], directory=Path(tmp))
        micro = 4 if args.loop == "micro" else 1
        samples = None if args.unsized else 4  # (per block: the blocks of a step add theirs up)

        def step(name: str, i: int) -> tuple[float, float]:
            model, opt = arms[name]
            c0 = time.thread_time()
            t0 = time.perf_counter()
            for m in range(micro):
                ctx = tracker.step(samples=samples) if name == "hooked" else contextlib.nullcontext()
                with ctx:
                    model(x).square().mean().backward()
                    if m == micro - 1:
                        opt.step()
                        opt.zero_grad()
            return time.perf_counter() - t0, time.thread_time() - c0

        times: dict[str, list[float]] = {name: [] for name in arms}
        cpu: dict[str, list[float]] = {name: [] for name in arms}
        order = list(arms)
        warmup = 50
        for i in range(args.rounds + warmup):
            order = order[1:] + order[:1]  # rotate: load from elsewhere hits every arm alike
            measured = {name: step(name, i) for name in order}
            sampled = tracker.sample_every > 0 and (i == 1 or i % tracker.sample_every == 0)
            if i >= warmup and not sampled:
                for name, (t, c) in measured.items():
                    times[name].append(t)
                    cpu[name].append(c)
        tracker.close()

    plain, control, hooked = times["plain"], times["control"], times["hooked"]
    cost = statistics.median(h - p for h, p in zip(hooked, plain, strict=True)) * 1e6
    noise = statistics.median(c - p for c, p in zip(control, plain, strict=True)) * 1e6
    told = "not told their samples" if args.unsized else "told their samples"
    print(f"{args.blocks}-block MLP (width {args.width}, batch 4), loop={args.loop}, steps {told},", end=" ")
    print(f"{len(plain)} rounds")
    for name in arms:
        print(f"  {name:8s} median step {statistics.median(times[name]) * 1e6:9.1f} µs")
    print(f"  hook cost per step: {cost:7.1f} µs   (A/A control: {noise:+.1f} µs)  wall clock")
    cost = statistics.median(h - p for h, p in zip(cpu["hooked"], cpu["plain"], strict=True)) * 1e6
    noise = statistics.median(c - p for c, p in zip(cpu["control"], cpu["plain"], strict=True)) * 1e6
    print(f"  hook cost per step: {cost:7.1f} µs   (A/A control: {noise:+.1f} µs)  training thread CPU")


if __name__ == "__main__":
    main()
