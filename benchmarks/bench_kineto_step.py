"""The op-group profiler against torch's own C++ profiler (kineto) on a small model's step: could a sampled
step of a sub-millisecond model be profiled for less than its own duration without a Python dispatch mode?

The 2-block MLP (bench_step_cost's, batch 4, single-tensor AdamW, one thread), interleaved rounds in one
process, three arms: ``plain``; ``kineto`` — ``torch.autograd.profiler.profile(record_shapes=True)`` around
the step, its events then read (name and shapes: what op groups and FLOPs would need), the reading timed
apart; ``hook`` — the hook's ``OpGroupProfiler`` (a Python dispatch mode) around the step, its result read.
Prints each arm's median step and its ratio to plain. (This torch's kineto also writes two lines to stderr at
every start and stop.)

Usage: python benchmarks/bench_kineto_step.py [--rounds 100]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from bench_step_cost import build
from torch.autograd.profiler import profile

from anatomy.hook.opgroups import OpGroupProfiler


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = build(2, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 64)

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def plain() -> tuple[float, float]:
        began = time.perf_counter()
        step()
        return time.perf_counter() - began, 0.0

    def kineto() -> tuple[float, float]:
        began = time.perf_counter()
        with profile(record_shapes=True) as prof:
            step()
        stepped = time.perf_counter()
        kept = getattr(prof, "kineto_results", None)
        n = 0
        for event in kept.events() if kept is not None else []:
            n += len(event.name()) + len(event.shapes())
        return stepped - began, time.perf_counter() - stepped

    def hook() -> tuple[float, float]:
        began = time.perf_counter()
        prof = OpGroupProfiler(model.modules(), cuda=False)
        with prof:
            step()
        stepped = time.perf_counter()
        prof.result()
        return stepped - began, time.perf_counter() - stepped

    arms: dict[str, Callable[[], tuple[float, float]]] = {"plain": plain, "kineto": kineto, "hook": hook}
    for fn in arms.values():  # (first calls: plans, imports, kineto's start-up)
        for _ in range(5):
            fn()
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    for _ in range(args.rounds):
        for name, fn in arms.items():
            got[name].append(fn())
    base = statistics.median(t for t, _ in got["plain"])
    print(f"2-block MLP, {args.rounds} interleaved rounds: the median step, and reading the result after it")
    for name, rows in got.items():
        step_s = statistics.median(t for t, _ in rows)
        read_s = statistics.median(r for _, r in rows)
        ratio = step_s / base
        print(f"  {name:7s} step {step_s * 1e3:7.3f} ms ({ratio:5.2f}x plain), read {read_s * 1e3:6.3f} ms")


if __name__ == "__main__":
    main()
