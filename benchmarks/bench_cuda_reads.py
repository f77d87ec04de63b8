"""What one read of the CUDA caching allocator's counters costs the training thread, the hook's way against
torch's flat functions (the baseline, in the same run): ``torch.cuda.memory_stats()`` and
``memory_allocated()`` flatten the allocator's nested statistics into a sorted dictionary on every call; the
hook's reader (``anatomy.hook.cuda.CudaAllocator``) looks its counters up in the nested one. Also the cost of
the step clock's CUDA events (create + record, the hook's mark with the stream kept, query, elapsed time),
the other per-step CUDA work.

Prints µs per call (median of rounds) and the ratio against ``torch.cuda.memory_stats()``, and gen-0
collections per 10,000 calls. Needs a GPU; without one it says so and exits 0.

Usage: python benchmarks/bench_cuda_reads.py [--calls 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import torch


def _per_call_us(fn: Callable[[], object], calls: int, rounds: int) -> tuple[float, float]:
    """Median µs per call over ``rounds``, and gen-0 collections per 10,000 calls."""
    times = []
    before = gc.get_stats()[0]["collections"]
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    collections = gc.get_stats()[0]["collections"] - before
    return statistics.median(times), collections * 10_000 / (calls * rounds)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_cuda_reads: no CUDA device here; nothing measured")
        return
    from anatomy.hook.cuda import CudaAllocator
    from anatomy.hook.timing import BEGIN, StepClock

    dev = torch.device("cuda", 0)
    keep = torch.empty(64 << 20, dtype=torch.uint8, device=dev)  # an allocator with something in it
    reader = CudaAllocator(dev)
    assert reader.allocated() == torch.cuda.memory_allocated(dev) >= keep.numel()
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    first = torch.cuda.Event(enable_timing=True)
    first.record()
    torch.cuda.synchronize()

    def event() -> None:
        torch.cuda.Event(enable_timing=True).record()

    def mark() -> None:
        StepClock(cuda=True).mark(BEGIN)

    again = torch.cuda.Event(enable_timing=True)  # one event recorded over and over (a pool's way)
    stream = torch.cuda.current_stream(dev)

    cases: list[tuple[str, Callable[[], object]]] = [
        ("torch.cuda.memory_stats() (baseline)", lambda: torch.cuda.memory_stats(dev)),
        ("torch.cuda.memory_allocated()", lambda: torch.cuda.memory_allocated(dev)),
        ("hook: CudaAllocator.allocated()", reader.allocated),
        ("hook: CudaAllocator.current_and_peak()", reader.current_and_peak),
        ("hook: CudaAllocator.stats()", reader.stats),
        ("CUDA event: create + record", event),
        ("hook: StepClock(cuda).mark (stream kept)", mark),
        ("CUDA event: record again (stream given)", lambda: again.record(stream)),
        ("CUDA event: query()", ev.query),
        ("CUDA event: elapsed_time()", lambda: first.elapsed_time(ev)),
    ]
    print(f"bench_cuda_reads: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    base = None
    for name, fn in cases:
        for _ in range(200):
            fn()
        us, gcs = _per_call_us(fn, args.calls, args.rounds)
        base = base if base is not None else us
        print(f"  {name:40s} {us:8.2f} µs/call  {us / base:6.3f}x baseline  gen-0 gc {gcs:6.1f} /10k calls")
    del keep


if __name__ == "__main__":
    main()
