"""What the per-op trace's probe of the gradients costs a traced step: a tiny Llama's training step under
``MemoryTrace`` reading glibc's heap, probing at every new high what the named tensors hold — the
gradients through a ``GradientWatcher`` — with the watcher told each phase as the tracker tells it (in a
forward only its first read looks at the parameters) against one never told (every read looks at every
parameter, as before). Interleaved rounds in one process; prints each arm's median traced step, the
trace's reads and its final stride (the trace strides when its reads cost more than the step's own time:
a cheaper probe leaves it reading more ops), and the plain step.

Usage: python benchmarks/bench_grad_probe.py [--layers 8,32] [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from bench_resum import llama

from anatomy.hook.gradients import GradientWatcher
from anatomy.hook.heap import HostHeap
from anatomy.hook.held import Held
from anatomy.hook.trace import MemoryTrace
from anatomy.vocabulary import Phase


def _compare(layers: int, rounds: int, heap: HostHeap) -> None:
    model = llama(layers)  # (bench_resum's tiny Llama)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1024, (2, 32))
    params = list(model.parameters())

    def step(phase: Callable[[Phase], None]) -> None:
        phase(Phase.FORWARD)
        loss = model(ids, labels=ids).loss
        phase(Phase.BACKWARD)
        loss.backward()
        phase(Phase.OPTIMIZER)
        opt.step()
        phase(Phase.OTHER)
        opt.zero_grad(set_to_none=True)

    def traced(told: bool) -> tuple[float, int, int]:
        watch = GradientWatcher(params)
        trace = MemoryTrace(read=heap.reader(), probe=lambda: Held(0, 0, watch.bytes))

        def phase(p: Phase) -> None:
            trace.phase = p
            if told:
                watch.phase_begins(p)

        t0 = time.perf_counter()
        with trace:
            step(phase)
        took = time.perf_counter() - t0
        watch.close()
        return took, trace.reads, trace.stride

    for _ in range(2):  # (warm: the optimizer's states, the ops' plans)
        step(lambda p: None)
        traced(True)
        traced(False)
    times: dict[str, list[float]] = {"plain": [], "told": [], "not told": []}
    reads: dict[str, list[int]] = {"told": [], "not told": []}
    strides: dict[str, list[int]] = {"told": [], "not told": []}
    for r in range(rounds):
        for arm in ("plain", "told", "not told") if r % 2 else ("not told", "told", "plain"):
            if arm == "plain":
                t0 = time.perf_counter()
                step(lambda p: None)
                times[arm].append(time.perf_counter() - t0)
                continue
            took, n, stride = traced(arm == "told")
            times[arm].append(took)
            reads[arm].append(n)
            strides[arm].append(stride)
    print(f"tiny Llama, {layers} layers ({len(params)} parameters), {rounds} interleaved rounds:")
    print(f"  plain step            {statistics.median(times['plain']) * 1e3:8.1f} ms")
    for arm in ("not told", "told"):
        print(
            f"  traced, watch {arm:8s} {statistics.median(times[arm]) * 1e3:8.1f} ms, "
            f"{statistics.median(reads[arm]):.0f} reads, stride {statistics.median(strides[arm]):.0f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", default="8,32")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    heap = HostHeap()
    if not heap.available:
        raise SystemExit("glibc's mallinfo2 is not available here: nothing to trace")
    for layers in (int(x) for x in args.layers.split(",")):
        _compare(layers, args.rounds, heap)


if __name__ == "__main__":
    main()
