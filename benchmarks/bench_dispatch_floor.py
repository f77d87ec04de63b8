"""What any per-op instrument built as a Python dispatch mode costs a small step, against what ours cost: a
2-block MLP's training step (about 77 ops: forward, backward, single-tensor AdamW on the CPU) timed in one
process, in interleaved rounds, with no mode, under a dispatch mode that does nothing (the floor for any
such instrument: torch calls into Python for every op), under the hook's op-group profiler and under its
per-op memory trace (each made fresh per step, as a sampled step makes it). Prints each arm's median step
and its ratio to the plain step, and the µs per op each adds.

Usage: python benchmarks/bench_dispatch_floor.py [--rounds 200] [--device cpu]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from bench_step_cost import build
from torch.utils._python_dispatch import TorchDispatchMode

from anatomy.hook.heap import HostHeap
from anatomy.hook.opgroups import OpGroupProfiler
from anatomy.hook.trace import MemoryTrace


class Nothing(TorchDispatchMode):
    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        return func(*args, **(kwargs or {}))


class Counting(TorchDispatchMode):
    ops = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        Counting.ops += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dev = torch.device(args.device)
    model = build(2, 64).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 64, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    heap = HostHeap()

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    @contextlib.contextmanager
    def profiler() -> Iterator[None]:
        # (as a sampled step makes it: on the CPU no device looked up per op)
        with OpGroupProfiler((), cuda=dev.type != "cpu"):
            yield

    @contextlib.contextmanager
    def trace() -> Iterator[None]:
        with MemoryTrace(read=heap.reader()):  # (the heap on the CPU, as the hook reads it there)
            yield

    arms: dict[str, Callable[[], Any]] = {
        "plain": contextlib.nullcontext,
        "nothing": Nothing,
        "op groups": profiler,
        "memory trace": trace,
    }
    with Counting():
        step()
    ops = Counting.ops
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(args.rounds + 5):
        for name, mode in arms.items():
            sync()
            t0 = time.perf_counter()
            with mode():
                step()
            sync()
            if r >= 5:  # (warm-up rounds left out)
                times[name].append(time.perf_counter() - t0)
    plain = statistics.median(times["plain"])
    print(f"2-block MLP on {args.device}: {ops} ops a step, {args.rounds} interleaved rounds")
    for name, ts in times.items():
        med = statistics.median(ts)
        per_op = (med - plain) / ops * 1e6
        print(f"  {name:<13} {med * 1e3:7.3f} ms  {med / plain:5.2f}x  {per_op:+6.1f} µs an op")


if __name__ == "__main__":
    main()
