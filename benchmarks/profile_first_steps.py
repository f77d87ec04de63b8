"""Where the hook's first steps go: a 2-block MLP (as the issue's sweep trains it, a step told its samples)
trained in two processes, one without and one with the hook (publishing, the recorder on, sampling at the
tracker's defaults), each step synchronized and timed; prints every one of the first ``--steps`` steps'
extra (hooked − plain, in usual steps), then ``cProfile`` of the hooked process's worst early step: its
functions by cumulative time. The sweep's "the most any step was held up" is one of these steps.

Usage: python benchmarks/profile_first_steps.py [--device cuda] [--steps 8] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _worker(hooked: bool, device: str, steps: int, profile_step: int, top: int) -> None:
    import torch
    from bench_step_cost import build

    torch.set_num_threads(1)
    dev = torch.device(device)
    model = build(2, 64).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 64, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    tracker = None
    if hooked:
        import anatomy

        tracker = anatomy.track(model, opt, directory=Path(tempfile.mkdtemp()))
    times: list[float] = []
    text = ""
    for i in range(steps + 40):  # (40 more: the usual step)
        profiler = cProfile.Profile() if i == profile_step else None
        sync()
        t0 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        if tracker is not None:
            with tracker.step(samples=4):
                model(x).sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        else:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()
        if profiler is not None:
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
            text = out.getvalue()
        times.append(time.perf_counter() - t0)
    if tracker is not None:
        tracker.close()
    print(json.dumps({"times": times, "profile": text}))


def _run(hooked: bool, device: str, steps: int, profile_step: int, top: int) -> dict[str, object]:
    args = [sys.executable, __file__, "--worker", "hooked" if hooked else "plain", "--device", device]
    args += ["--steps", str(steps), "--profile-step", str(profile_step), "--top", str(top)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--worker", choices=["plain", "hooked"], help=argparse.SUPPRESS)
    ap.add_argument("--profile-step", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker == "hooked", args.device, args.steps, args.profile_step, args.top)
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("profile_first_steps: no CUDA here")
            return
    plain = _run(False, args.device, args.steps, -1, args.top)
    hooked = _run(True, args.device, args.steps, -1, args.top)
    p, h = plain["times"], hooked["times"]
    assert isinstance(p, list) and isinstance(h, list)
    usual = statistics.median(p[args.steps :])
    print(f"2-block MLP on {args.device}: the usual plain step {usual * 1e3:.3f} ms")
    extras = [(b - a) / usual for a, b in zip(p[: args.steps], h[: args.steps], strict=True)]
    for i, e in enumerate(extras):
        ms = f"plain {p[i] * 1e3:8.3f} ms, hooked {h[i] * 1e3:8.3f} ms"
        print(f"  step {i}: {ms}, extra {e:+6.2f} usual steps")
    worst = max(range(len(extras)), key=lambda i: extras[i])
    profiled = _run(True, args.device, args.steps, worst, args.top)
    print(f"cProfile of the hooked process's step {worst}, by cumulative time:")
    print(profiled["profile"])


if __name__ == "__main__":
    main()
