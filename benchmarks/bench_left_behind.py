"""What the hook leaves on a model after watching it: the training step of a model a tracker watched — its
sampled and traced steps included — then closed, against identical models it never saw, in one process.

Anything a tracker leaves in torch's C++ state on the model (a tensor hook whose handle was removed but whose
C++ side stays, an autograd node kept alive) costs every later step of the run, where no code of ours runs
and no Python-level trace shows it. Models in one process share everything process-wide, so this isolates
what is left on the watched model itself:

- ``plain``: a model and AdamW the hook never saw (the baseline; ``bench_hook_sweep.py``'s model and batch at
  width 64);
- ``control``: an identical second one (the A/A noise floor of the comparison);
- ``watched``: an identical one that a tracker watched for ``--watched`` steps (every one of them in full:
  not told its samples; ``sample_every`` small, so sampled and traced steps ran), then closed.

With ``--hold-accumulators`` every arm holds its parameters' gradient accumulators for the run, as DDP's
reducer does: a hook on one then outlives the graph.

Interleaved rounds, one step of each per round, the training thread's CPU time; printed: the median step of
each and the median of per-round differences to ``plain``, and what the watched model's parameters still
hold.

Usage: python benchmarks/bench_left_behind.py [--model mlp|llama] [--blocks 8] [--rounds 3000] [--watched 30]
       [--hold-accumulators]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_hook_sweep import Config, _batch_size, _build, _loss, _sample

import anatomy


def build(config: Config) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The sweep's model (identical weights in every arm) and AdamW."""
    model = _build(config)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def batch_for(config: Config) -> dict[str, torch.Tensor]:
    """The sweep's batch: its one sample, stacked."""
    n = _batch_size(config)
    return {k: torch.stack([v] * n) for k, v in _sample(config).items()}


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    _loss(model, batch).backward()
    opt.step()
    opt.zero_grad()


def left_on(model: torch.nn.Module) -> dict[str, int]:
    """Tensor-level hooks the parameters hold (a dict set once stays, even empty: its C++ hook with it)."""
    params = list(model.parameters())
    return {
        "post-accumulate-grad hook dicts": sum(p._post_accumulate_grad_hooks is not None for p in params),
        "backward hook dicts": sum(p._backward_hooks is not None for p in params),
        "forward hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules()),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("mlp", "llama"), default="mlp")
    parser.add_argument("--blocks", type=int, default=8, help="MLP blocks or Llama layers")
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--watched", type=int, default=30, help="steps the tracker watches before it closes")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument(
        "--hold-accumulators",
        action="store_true",
        help="every arm holds its parameters' gradient accumulators for the run, as DDP's reducer does",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = Config(loop="plain", model=args.model, depth=args.blocks, width=64)
    x = batch_for(config)
    arms: dict[str, tuple[Any, Any]] = {name: build(config) for name in ("plain", "control", "watched")}
    held = []
    if args.hold_accumulators:
        from torch.autograd.graph import get_gradient_edge

        held = [get_gradient_edge(p).node for m, _ in arms.values() for p in m.parameters()]
    model, opt = arms["watched"]
    tracker = anatomy.track(model, opt, publish=False, record=False, sample_every=4)
    for _ in range(args.watched):
        with tracker.step():
            train(model, opt, x)
    tracker.close()
    for name in ("plain", "control"):  # (the same number of steps behind them)
        for _ in range(args.watched):
            train(*arms[name], x)
    times: dict[str, list[int]] = {name: [] for name in arms}
    for _ in range(args.warmup + args.rounds):
        for name, (m, o) in arms.items():
            c0 = time.thread_time_ns()
            train(m, o, x)
            times[name].append(time.thread_time_ns() - c0)
    w = args.warmup
    plain = times["plain"][w:]
    print(
        f"left behind: {args.model}, {args.blocks} blocks ({sum(1 for _ in model.parameters())} parameters), "
        f"{args.rounds} rounds, one process, training-thread CPU; watched {args.watched} steps, then closed"
    )
    for name in arms:
        own = times[name][w:]
        extra = statistics.median(a - b for a, b in zip(own, plain, strict=True)) / 1e3
        print(f"  {name:8s} step {statistics.median(own) / 1e3:8.1f} µs   extra {extra:+7.1f} µs")
    print(f"  the watched model holds: {left_on(model)}")
    if held:
        print(f"  every arm held its {len(held) // len(arms)} gradient accumulators (as DDP's reducer does)")


if __name__ == "__main__":
    main()
