"""The flight recorder's memory in the training process: what it holds after a long run (rows only, as a
fast step leaves it: one snapshot, then a row per step, no rewrite), counted three ways — objects the
garbage collector tracks (gc.get_objects), bytes allocated (tracemalloc), and the time of a full
gc.collect() with the recorder alive against the same after it is gone (the baseline, this run).

Usage: python benchmarks/bench_recorder_memory.py [--steps 80000]
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
import tracemalloc
from pathlib import Path

from anatomy.protocol import Hello, Snapshot, Timing
from anatomy.recorder import Recorder


def _hello() -> Hello:
    return Hello(
        pid=os.getpid(),
        host="box",
        device="cpu",
        precision="fp32",
        optimizer="adamw",
        model_class="Toy",
        parameter_count=1000,
        torch_version="2",
        started_at=1.7e9,
    )


def _snap(step: int) -> Snapshot:
    return Snapshot(
        pid=os.getpid(),
        seq=step + 1,
        time=1.7e9 + step,
        step=step,
        memory={"weights": 4000, "activations": 1000 + step % 7},
        expected_bytes_per_param={"weights": 4.0},
        parameter_count=1000,
        peak_bytes=10_000 + step % 100,
        timing=Timing(step_s=0.1 + (step % 10) / 100, forward_s=0.03, backward_s=0.06, optimizer_s=0.01),
    )


def _collect_ms(rounds: int = 5) -> float:
    t0 = time.perf_counter()
    for _ in range(rounds):
        gc.collect()
    return (time.perf_counter() - t0) / rounds * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=80_000)
    args = ap.parse_args()
    hello = _hello()
    gc.collect()
    objects = len(gc.get_objects())
    tracemalloc.start()
    recorder = Recorder(Path(tempfile.mkdtemp(prefix="anatomy-bench-recmem-")), snapshot_interval_s=1e9)
    for start in range(0, args.steps, 10):
        recorder.tick(hello, [_snap(s) for s in range(start, start + 10)])
    gc.collect()
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tracked = len(gc.get_objects()) - objects
    with_recorder = _collect_ms()
    rewrites = recorder.rewrites
    del recorder
    gc.collect()
    without = _collect_ms()
    print(
        f"{args.steps:,} steps recorded ({rewrites} rewrites): +{tracked:,} GC-tracked objects, "
        f"{held / 2**20:.1f} MiB allocated"
    )
    print(
        f"full gc.collect(): {with_recorder:.1f} ms with the recorder, {without:.1f} ms without "
        f"({with_recorder / without:.2f}x)"
    )


if __name__ == "__main__":
    main()
