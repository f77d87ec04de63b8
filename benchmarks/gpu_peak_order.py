"""Whether the user's ``torch.cuda.max_memory_allocated()`` moves with the hook or with the run's place in
the process: the GPU check's bf16 Llama trained six times in one process — without the hook, with it
(sampling every 3rd step), without, with it and no sampling, without, with it again — printing each run's
per-step peaks and their difference from the first run. Needs a GPU; without one it says so and exits 0.

What it showed on an H200 (2026-11-27, ``gpu_runs/2026-11-27/gpu_peak_order_h200.txt``): the first run differs
from every later one (+30.5 MiB at step 0, -0.31 MiB after: the libraries' workspaces made inside its first
step), and runs 2 to 6 are identical, hook or not — so ``scripts/gpu_check`` runs an unmeasured run first.

Usage: python benchmarks/gpu_peak_order.py
"""

from __future__ import annotations

import functools

import torch

MIB = 2**20


def main() -> None:
    if not torch.cuda.is_available():
        print("gpu_peak_order: no CUDA device here; nothing measured")
        return
    import anatomy
    from anatomy.gpucheck import workloads

    dev = torch.device("cuda", 0)
    work = workloads.WORKLOADS[0]
    track = anatomy.track
    first: list[int] = []
    runs = [
        ("without the hook", False, 3),
        ("with it (sample_every=3)", True, 3),
        ("without", False, 3),
        ("with it (no sampling)", True, 0),
        ("without", False, 3),
        ("with it (sample_every=3)", True, 3),
    ]
    try:
        for i, (label, hooked, every) in enumerate(runs, 1):
            anatomy.track = functools.partial(track, sample_every=every)  # train() calls anatomy.track
            with workloads.publishing_dir() as directory:
                run = workloads.train(work, hooked, directory, dev)
            workloads.release()
            peaks = run.user_peaks
            first = first or peaks
            diff = [round((b - a) / MIB, 2) for a, b in zip(first, peaks, strict=True)]
            print(f"run {i} {label:26s} peaks MiB {[round(p / MIB, 2) for p in peaks]}  vs run 1 {diff}")
    finally:
        anatomy.track = track


if __name__ == "__main__":
    main()
