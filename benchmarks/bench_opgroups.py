"""Cost of the op-group profiler on one sampled training step, against an unprofiled step.

A small BERT (hidden 256, 4 layers, batch 8 x 128, AdamW) trains on CPU; ``--mlp N``: an N-block MLP
of width 64 instead (the sub-millisecond step, where the cost per op is all there is). Steps are
interleaved: plain, profiled (OpGroupProfiler with set_phase around the optimizer), FlopCounterMode
(torch's own dispatch-mode FLOP counter), and a dispatch mode that does nothing but run each op (what
any dispatch mode costs: torch's floor). Prints the median seconds of each and their ratio to the plain
step measured in the same run; per op, what each adds over the plain step and what the profiler adds
over the do-nothing mode (its own code); and the FLOP and time shares the profiler found.

Both wall time and process CPU time are reported: on a shared machine the CPU time is the steadier
figure (other processes stretch wall time, not the CPU time this one needs). One intra-op thread by
default for the same reason.

    .venv/bin/python benchmarks/bench_opgroups.py [--reps 7] [--hidden 256] [--layers 4] [--threads 1]
    .venv/bin/python benchmarks/bench_opgroups.py --mlp 2 --reps 301
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertForSequenceClassification

from anatomy.hook.opgroups import OpGroupProfiler
from anatomy.vocabulary import Phase


def build(hidden: int, layers: int, batch: int, seq: int) -> Callable[[OpGroupProfiler | None], None]:
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        intermediate_size=4 * hidden,
    )
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs = torch.randint(100, 30000, (batch, seq))
    labels = torch.randint(0, 2, (batch,))

    def step(prof: OpGroupProfiler | None = None) -> None:
        model(input_ids=inputs, labels=labels).loss.backward()
        if prof is not None:
            prof.set_phase(Phase.OPTIMIZER)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def build_mlp(blocks: int) -> Callable[[OpGroupProfiler | None], None]:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 64)

    def step(prof: OpGroupProfiler | None = None) -> None:
        model(x).sum().backward()
        if prof is not None:
            prof.set_phase(Phase.OPTIMIZER)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


class Nothing(TorchDispatchMode):
    """Runs each op and counts it: what torch's dispatch to any Python mode costs."""

    ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        Nothing.ops += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mlp", type=int, default=0, help="an MLP of this many blocks, not the BERT")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    step = build_mlp(args.mlp) if args.mlp else build(args.hidden, args.layers, args.batch, args.seq)
    for _ in range(2):
        step(None)  # warm-up; the first step also creates AdamW's states

    wall: dict[str, list[float]] = {"plain": [], "profiled": [], "flop_counter": [], "nothing": []}
    cpu: dict[str, list[float]] = {k: [] for k in wall}
    profilers: list[OpGroupProfiler] = []

    def timed(name: str, fn: Callable[[], None]) -> None:
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall[name].append(time.perf_counter() - w)
        cpu[name].append(time.process_time() - c)

    def profiled() -> None:
        prof = OpGroupProfiler()
        with prof:
            step(prof)
        assert prof.result() is not None  # included in the time: on CPU it is ready at once
        profilers[:] = [prof]

    def flop_counter() -> None:
        with FlopCounterMode(display=False):
            step(None)

    def nothing() -> None:
        with Nothing():
            step(None)

    for _ in range(args.reps):
        timed("plain", lambda: step(None))
        timed("profiled", profiled)
        timed("flop_counter", flop_counter)
        timed("nothing", nothing)
    ops = Nothing.ops / args.reps

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.reps} interleaved repetitions"
    )
    if args.mlp:
        print(f"MLP of {args.mlp} blocks, width 64, batch 4, AdamW, CPU")
    else:
        print(f"BERT hidden {args.hidden}, {args.layers} layers, batch {args.batch} x {args.seq}, AdamW, CPU")
    base_w, base_c = statistics.median(wall["plain"]), statistics.median(cpu["plain"])
    for name in wall:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(
            f"  {name:<13} wall {w * 1000:8.3f} ms ({w / base_w:5.2f}x)"
            f"   cpu {c * 1000:8.3f} ms ({c / base_c:5.2f}x)   medians, ratios to plain;"
            f" per op {(c - base_c) / ops * 1e6:+6.1f} µs cpu"
        )
    own = [p - n for p, n in zip(cpu["profiled"], cpu["nothing"], strict=True)]
    print(
        f"  the profiler's own code over the do-nothing mode: {statistics.median(own) / ops * 1e6:+.1f} µs"
        f" cpu per op (median of the rounds' differences; {ops:.0f} ops a step)"
    )
    last = profilers[0]
    result = last.result()
    assert result is not None
    total_flops = sum(s.flops or 0.0 for s in result.values())
    total_time = sum(s.time_s or 0.0 for s in result.values())
    print(f"  ops seen per step: {last.op_count}; FLOPs {total_flops / 1e9:.2f} G")
    for group, stat in result.items():
        print(
            f"  {group.value:<27} FLOPs {100 * (stat.flops or 0) / total_flops:6.2f}%"
            f"   time {100 * (stat.time_s or 0) / total_time:6.2f}%"
        )


if __name__ == "__main__":
    main()
