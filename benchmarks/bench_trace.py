"""Cost of the per-op memory trace on one training step, against the same step untraced.

A tiny Llama (``--layers``, hidden 64, batch 4 x 32, AdamW) trains on CPU in a process that imported
transformers, whose heap makes a ``mallinfo2`` read cost tens of µs. Steps are interleaved: plain; traced
as the hook traces (reads after the ops that may allocate and each phase's first op); traced reading
after every op (the trace before it skipped any); a dispatch mode that does nothing (torch's floor of any
mode). The trace's stride is held at 1, as on a small model's whole step, so the two traced arms differ
only by the reads skipped. Prints the medians, their ratios to the plain step of the same run, the reads a
step and the µs a read costs.

    .venv/bin/python benchmarks/bench_trace.py [--layers 2] [--reps 41]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from anatomy.hook import trace as trace_module
from anatomy.hook.heap import HostHeap
from anatomy.hook.trace import MemoryTrace
from anatomy.vocabulary import Phase


class Nothing(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def build(layers: int) -> Callable[[Any], None]:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
                         num_hidden_layers=layers, vocab_size=1024)  # fmt: skip
    model = LlamaForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 1024, (4, 32))

    def step(trace: Any) -> None:
        if trace is not None:
            trace.phase = Phase.FORWARD
        loss = model(input_ids=ids, labels=ids).loss
        if trace is not None:
            trace.phase = Phase.BACKWARD
        loss.backward()
        if trace is not None:
            trace.phase = Phase.OPTIMIZER
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--reps", type=int, default=41)
    args = parser.parse_args()
    torch.set_num_threads(1)
    step = build(args.layers)
    heap = HostHeap()
    if not heap.available:
        raise SystemExit("glibc's mallinfo2 is not available here: nothing to trace")
    step(None)
    cpu: dict[str, list[float]] = {"plain": [], "traced": [], "every op": [], "nothing": []}
    reads: dict[str, int] = {}
    spent: dict[str, float] = {}
    allocates = trace_module._allocates

    def traced(every: bool) -> None:
        trace = MemoryTrace(read=heap.reader())  # (as the hook reads it)
        trace_module._ALLOCATES.clear()
        if every:
            trace_module._allocates = lambda func: True  # type: ignore[assignment]
        try:
            with trace:
                step(trace)
        finally:
            trace_module._allocates = allocates  # type: ignore[assignment]
        name = "every op" if every else "traced"
        reads[name], spent[name] = trace.reads, trace.spent_s

    def nothing() -> None:
        with Nothing():
            step(None)

    arms: dict[str, Callable[[], None]] = {
        "plain": lambda: step(None),
        "traced": lambda: traced(False),
        "every op": lambda: traced(True),
        "nothing": nothing,
    }
    grace = trace_module.GRACE_READS, trace_module.GRACE_S
    trace_module.GRACE_READS, trace_module.GRACE_S = 1 << 30, float("inf")  # (stride 1 throughout)
    try:
        for _ in range(args.reps):
            for name, arm in arms.items():
                began = time.process_time()
                arm()
                cpu[name].append(time.process_time() - began)
    finally:
        trace_module.GRACE_READS, trace_module.GRACE_S = grace
    base = statistics.median(cpu["plain"])
    print(f"torch {torch.__version__}, 1 thread, {args.reps} interleaved repetitions")
    print(f"tiny Llama, {args.layers} layers, hidden 64, batch 4 x 32, AdamW, CPU")
    for name, times in cpu.items():
        t = statistics.median(times)
        extra = ""
        if name in reads:
            extra = f"   {reads[name]} reads a step, {spent[name] / max(reads[name], 1) * 1e6:.1f} µs a read"
        print(f"  {name:<9} cpu {t * 1000:8.2f} ms ({t / base:5.2f}x){extra}")
    saved = [e - t for e, t in zip(cpu["every op"], cpu["traced"], strict=True)]
    print(
        f"  reading only after ops that may allocate saves {statistics.median(saved) * 1000:.2f} ms"
        " a traced step (median of the rounds' differences)"
    )


if __name__ == "__main__":
    main()
