"""Where an ordinary hooked step's host time goes on a GPU: a small MLP (64 wide, batch 64) on ``cuda:0``
trained without and with the hook (publishing, as by default), µs per step of wall and training-thread CPU
and gc collections over 600 steps each, then ``cProfile`` over 300 hooked steps — the top entries, and those
of the hook and ``torch.cuda``. Needs a GPU; without one it says so and exits 0.

Usage: python benchmarks/profile_cuda_step.py [DEPTH ...]   (blocks; default 2 and 32)
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import io
import pstats
import sys
import time
from collections.abc import Callable

import torch

STEPS = 600


def _model(depth: int, dev: torch.device) -> torch.nn.Module:
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
        for _ in range(depth)
    ]
    return torch.nn.Sequential(*blocks).to(dev)


def main(argv: list[str]) -> None:
    if not torch.cuda.is_available():
        print("profile_cuda_step: no CUDA device here; nothing measured")
        return
    import anatomy

    dev = torch.device("cuda", 0)
    for depth in [int(a) for a in argv] or [2, 32]:
        for hooked in (False, True):
            torch.manual_seed(0)
            model = _model(depth, dev)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            x = torch.randn(64, 64, device=dev)
            tracker = anatomy.track(model, opt) if hooked else None

            def step(
                model: torch.nn.Module = model,
                opt: torch.optim.Optimizer = opt,
                x: torch.Tensor = x,
                tracker: anatomy.Tracker | None = tracker,
            ) -> None:
                with tracker.step(samples=64) if tracker is not None else contextlib.nullcontext():
                    model(x).square().mean().backward()
                    opt.step()
                    opt.zero_grad()

            _measure(depth, hooked, step)
            if tracker is not None:
                profile = cProfile.Profile()
                profile.enable()
                for _ in range(STEPS // 2):
                    step()
                profile.disable()
                torch.cuda.synchronize()
                out = io.StringIO()
                stats = pstats.Stats(profile, stream=out).sort_stats("tottime")
                stats.print_stats(12)
                stats.print_stats("anatomy|cuda", 25)
                print("\n".join(line for line in out.getvalue().splitlines() if line.strip()))
                tracker.close()


def _measure(depth: int, hooked: bool, step: Callable[[], None]) -> None:
    for _ in range(30):
        step()
    torch.cuda.synchronize()
    before = [s["collections"] for s in gc.get_stats()]
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(STEPS):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / STEPS * 1e6
    cpu = (time.thread_time() - c0) / STEPS * 1e6
    gcs = [b - a for a, b in zip(before, [s["collections"] for s in gc.get_stats()], strict=True)]
    print(f"depth {depth} hooked={hooked}: {wall:.0f} µs/step wall, {cpu:.0f} µs/step thread CPU, gc {gcs}")


if __name__ == "__main__":
    main(sys.argv[1:])
