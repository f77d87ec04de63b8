"""Where the hook's first steps go: a 2-block MLP (``--blocks``; as the issue's sweep trains it, a step
told its samples) trained in two processes, one without and one with the hook (publishing, the recorder on,
sampling at the tracker's defaults), each step synchronized and timed; prints every one of the first
``--steps`` steps' extra (hooked − plain, in usual steps), then ``cProfile`` of the hooked process's worst
early step: its functions by cumulative time. The sweep's "the most any step was held up" is one of
these steps.

With ``--rounds N`` each round starts fresh processes — plain, the working tree's hook and, with ``--base
REV`` (or ``--base-dir``: the package exported there), the hook as that revision had it — in rotating
order, and the extras printed are each step's median over the rounds with their range; ``this − base`` per
round too. A first step is once per process: only fresh processes repeat it.

Usage: python benchmarks/profile_first_steps.py [--device cuda] [--steps 8] [--top 30]
       python benchmarks/profile_first_steps.py --rounds 9 --base HEAD --no-profile
       python benchmarks/profile_first_steps.py --blocks 8 --steps 48 --rounds 5 --base HEAD --no-profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_hook_versions import export, worker_env

ROOT = Path(__file__).resolve().parents[1]


def _model(blocks: int) -> Any:
    """The MLP: ``blocks == 2`` the flat one of ``bench_step_cost`` (two linear layers and their ReLUs, as
    every earlier run of this benchmark), more the issue's sweep's (``blocks`` blocks of linear, ReLU,
    linear: a stack of repeated blocks, so 8 or more are instrumented in pieces)."""
    import torch

    if blocks == 2:
        from bench_step_cost import build

        return build(2, 64)
    torch.manual_seed(0)
    layers = [
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
        for _ in range(blocks)
    ]
    return torch.nn.Sequential(*layers)


def _worker(hooked: bool, device: str, steps: int, profile_step: int, top: int, blocks: int = 2) -> None:
    import torch

    torch.set_num_threads(1)
    dev = torch.device(device)
    model = _model(blocks).to(dev)
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


def _run(
    hooked: bool, device: str, steps: int, profile_step: int, top: int, src: Path = ROOT, blocks: int = 2
) -> dict[str, object]:
    """One worker process; ``src``: where its ``anatomy`` package comes from (the working tree's, or a
    revision's exported)."""
    args = [sys.executable, __file__, "--worker", "hooked" if hooked else "plain", "--device", device]
    args += ["--steps", str(steps), "--profile-step", str(profile_step), "--top", str(top)]
    args += ["--blocks", str(blocks)]
    env = worker_env(src)
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _times(result: dict[str, object]) -> list[float]:
    times = result["times"]
    assert isinstance(times, list)
    return [float(t) for t in times]


def _rounds(args: argparse.Namespace, base_src: Path | None) -> None:
    """``--rounds``: fresh processes per round, each step's extra as the median over rounds."""
    arms: dict[str, Path | None] = {"plain": None, "this": ROOT}
    if base_src is not None:
        arms["base"] = base_src
    names = list(arms)
    extras: dict[str, list[list[float]]] = {a: [] for a in names if a != "plain"}
    usuals: list[float] = []
    for r in range(args.rounds):
        got: dict[str, list[float]] = {}
        for arm in names[r % len(names) :] + names[: r % len(names)]:  # (rotating order)
            src = arms[arm]
            hooked = src is not None
            got[arm] = _times(_run(hooked, args.device, args.steps, -1, args.top, src or ROOT, args.blocks))
        usual = statistics.median(got["plain"][args.steps :])
        usuals.append(usual)
        for arm in extras:
            extras[arm].append(
                [
                    (b - a) / usual
                    for a, b in zip(got["plain"][: args.steps], got[arm][: args.steps], strict=True)
                ]
            )
    print(
        f"{args.blocks}-block MLP on {args.device}, {args.rounds} rounds of fresh processes "
        f"({', '.join(names)}): the usual plain step {statistics.median(usuals) * 1e3:.3f} ms"
    )
    for i in range(args.steps):
        parts = []
        for arm, rows in extras.items():
            col = [row[i] for row in rows]
            parts.append(f"{arm} {statistics.median(col):+6.2f} ({min(col):+.2f}..{max(col):+.2f})")
        if "base" in extras:
            diff = [t[i] - b[i] for t, b in zip(extras["this"], extras["base"], strict=True)]
            parts.append(f"this − base {statistics.median(diff):+6.2f}")
        print(f"  step {i}: extra in usual steps, median (range): " + ", ".join(parts))
    worst = statistics.median(max(row) for row in extras["this"])
    print(f"  the most any of the first {args.steps} steps was held up (this): median {worst:.2f}")
    if "base" in extras:
        print(f"  (base): median {statistics.median(max(row) for row in extras['base']):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=2, help="the MLP's blocks (8 or more: pieces)")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--worker", choices=["plain", "hooked"], help=argparse.SUPPRESS)
    ap.add_argument("--profile-step", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=0, help="fresh processes per round, medians over rounds")
    ap.add_argument("--base", default=None, help="with --rounds: the hook at this git revision too")
    ap.add_argument("--base-dir", type=Path, default=None, help="the base's package already exported here")
    ap.add_argument("--no-profile", action="store_true", help="skip the worst step's cProfile")
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker == "hooked", args.device, args.steps, args.profile_step, args.top, args.blocks)
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("profile_first_steps: no CUDA here")
            return
    if args.rounds > 0:
        with tempfile.TemporaryDirectory() as tmp:
            base_src = args.base_dir.resolve() if args.base_dir else None
            if base_src is None and args.base:
                base_src = export(args.base, Path(tmp))
            _rounds(args, base_src)
        if args.no_profile:
            return
    plain = _run(False, args.device, args.steps, -1, args.top, blocks=args.blocks)
    hooked = _run(True, args.device, args.steps, -1, args.top, blocks=args.blocks)
    p, h = plain["times"], hooked["times"]
    assert isinstance(p, list) and isinstance(h, list)
    usual = statistics.median(p[args.steps :])
    print(f"{args.blocks}-block MLP on {args.device}: the usual plain step {usual * 1e3:.3f} ms")
    extras = [(b - a) / usual for a, b in zip(p[: args.steps], h[: args.steps], strict=True)]
    for i, e in enumerate(extras):
        ms = f"plain {p[i] * 1e3:8.3f} ms, hooked {h[i] * 1e3:8.3f} ms"
        print(f"  step {i}: {ms}, extra {e:+6.2f} usual steps")
    worst = max(range(len(extras)), key=lambda i: extras[i])
    profiled = _run(True, args.device, args.steps, worst, args.top, blocks=args.blocks)
    print(f"cProfile of the hooked process's step {worst}, by cumulative time:")
    print(profiled["profile"])


if __name__ == "__main__":
    main()
