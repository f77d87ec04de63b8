"""What the hook's ordinary step costs in instructions: counted by valgrind, not timed.

Timing whole processes cannot resolve tens of µs on this box: every process carries an offset of its own
(where its pages and objects landed) of ±20-100 µs a step, and importing the hook alone moved a step by
+34 to +113 µs in runs of three to six processes per arm (``cpu_runs/2026-11-28-d``). An instruction count
has no such noise: valgrind's cachegrind counts every instruction every thread of the process executes,
the same on every run. So each arm runs twice under cachegrind, with ``--warmup`` steps and then with
``--steps`` more; the difference over ``--steps`` is one ordinary step's instructions, the first steps'
work (sampled, traced, first sums) cancelled out. Arms:

- ``plain``: the loop without the hook;
- ``import``: the loop in a process that imported ``anatomy.hook.tracker`` before building its model (as a
  script's ``import anatomy`` does), no tracker made — what importing the hook adds to a step;
- ``hooked``: ``anatomy.track(model, opt)`` at its defaults but for ``interval_s`` (``--interval``: by
  default an hour, so no step after the first ones looks, re-counts or builds a snapshot — what is measured
  is the ordinary step; valgrind runs a step ~50 times slower, so the default half second would make every
  other step a look), the step told its samples as README's loop tells it: the step rests. Its count holds
  the flight recorder's work for each step's row too (done on the publisher's thread in a run; here, with
  no publish interval passing, when the tracker closes);
- ``unrecorded``: the same with ``record=False``: the step alone;
- ``quiet``: the same with ``publish=False`` too: no thread of ours in the process. Under valgrind a step
  takes ~50 times as long, so a thread that wakes by the clock (the publisher's, twice a second) wakes many
  times a step, and the GIL changing hands with it counts as the step's work (``cpu_runs/2026-11-28-e``, the
  32-block MLP); this arm is the training thread's own step.

Printed per model: instructions per step of each arm, the hooked and import arms' extra over plain, the
extra as a share of the plain step, and as µs at the plain step's own rate on this machine (its native
median step time over its instructions: a hook's Python runs at a lower rate than torch's kernels, so read
it as a lower bound of the time), and how many of the measured hooked steps rested.

Threads: OpenBLAS's and OpenMP's pools are held to one thread (the loop runs torch on one thread) so that
idle worker threads' spinning, whose length depends on scheduling, stays out of the count.

Usage: python benchmarks/bench_hook_instructions.py [--models mlp:2,mlp:8,mlp:32,llama:2] [--steps 40]
       [--arms import,hooked,unrecorded,quiet] [--jobs 2]   (about 2 minutes a run on the 2-block MLP)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("plain", "import", "hooked", "unrecorded", "quiet")
VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def worker(arm: str, model_kind: str, depth: int, steps: int, interval_s: float) -> None:
    """One process of one arm: ``steps`` steps, then how many rested and how many threads ran, on stdout."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import torch

    if arm == "import":
        import anatomy.hook.tracker
    from bench_hook_sweep import LLAMA, MLP_WIDTH, Config, _batch_size, _build, _loss, _sample

    torch.set_num_threads(1)
    config = Config("plain", model_kind, depth, MLP_WIDTH if model_kind == "mlp" else LLAMA["hidden"])
    model = _build(config)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n = _batch_size(config)
    batch = {k: torch.stack([v] * n) for k, v in _sample(config).items()}
    tokens = int(batch["input_ids"].numel()) if "input_ids" in batch else None
    tracker: Any = None
    rested = [0]
    if arm in ("hooked", "unrecorded", "quiet"):
        import anatomy
        from anatomy.hook.resting import RestingSteps

        original = RestingSteps._rest_begin

        def rest_begin(self: Any, samples: int | None, tok: int | None) -> bool:
            ok = original(self, samples, tok)
            rested[0] += ok
            return ok

        RestingSteps._rest_begin = rest_begin  # type: ignore[method-assign,assignment]
        tracker = anatomy.track(
            model, opt, interval_s=interval_s, record=arm == "hooked", publish=arm != "quiet"
        )
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        if tracker is not None:
            with tracker.step(samples=n, tokens=tokens):
                _loss(model, batch).backward()
                opt.step()
                opt.zero_grad()
        else:
            _loss(model, batch).backward()
            opt.step()
            opt.zero_grad()
        times.append(time.perf_counter() - t0)
    threads = threading.active_count()  # (the quiet arm's claim: the training thread alone)
    if tracker is not None:
        tracker.close()
    times.sort()
    print(f"rested {rested[0]} threads {threads} median_s {times[len(times) // 2]!r}")


def _run_worker(
    prefix: list[str], arm: str, model: str, depth: int, steps: int, interval_s: float
) -> subprocess.CompletedProcess[str]:
    """One worker process (``prefix``: what runs it, e.g. valgrind), its output captured."""
    cmd = [*prefix, sys.executable, __file__, "--worker", arm, model, str(depth), str(steps), str(interval_s)]
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV}, check=True)


def _count(arm: str, model: str, depth: int, steps: int, interval_s: float) -> tuple[int, int]:
    """(instructions of the whole process, steps that rested) of one worker run under cachegrind."""
    out = _run_worker(VALGRIND, arm, model, depth, steps, interval_s)
    refs = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    rested = re.search(r"rested (\d+)", out.stdout)
    if refs is None or rested is None:
        raise RuntimeError(f"no count from {arm} {model}:{depth}: {out.stderr[-400:]}")
    return int(refs.group(1).replace(",", "")), int(rested.group(1))


def _native_step_s(model: str, depth: int, steps: int) -> float:
    """The plain loop's median step on this machine, without valgrind."""
    out = _run_worker([], "plain", model, depth, steps, 3600.0)
    found = re.search(r"median_s (\S+)", out.stdout)
    if found is None:
        raise RuntimeError(f"no native time from {model}:{depth}: {out.stderr[-400:]}")
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="mlp:2,mlp:8,mlp:32,llama:2")
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="steps in both runs of an arm (default: 20 + depth)",
    )
    parser.add_argument("--steps", type=int, default=40, help="steps the second run of an arm adds")
    parser.add_argument("--interval", type=float, default=3600.0, help="the hooked arm's interval_s")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--arms", default=",".join(ARMS), help="plain and any of the others")
    args = parser.parse_args()
    models = [(m.split(":")[0], int(m.split(":")[1])) for m in args.models.split(",")]
    arms = ("plain", *(a for a in args.arms.split(",") if a in ARMS and a != "plain"))
    warmup = {m: args.warmup if args.warmup is not None else 20 + m[1] for m in models}
    runs = [
        (arm, model, depth, steps)
        for model, depth in models
        for arm in arms
        for steps in (warmup[(model, depth)], warmup[(model, depth)] + args.steps)
    ]
    with ThreadPoolExecutor(args.jobs) as pool:
        counts = dict(
            zip(runs, pool.map(lambda r: _count(r[0], r[1], r[2], r[3], args.interval), runs), strict=True)
        )
        natives = dict(zip(models, pool.map(lambda m: _native_step_s(m[0], m[1], 200), models), strict=True))
    print(
        f"instructions per ordinary step (cachegrind; the difference of a run of the first steps and one "
        f"{args.steps} steps longer), hooked at interval_s={args.interval:g}"
    )
    for model, depth in models:
        w = warmup[(model, depth)]
        per = {
            arm: (counts[(arm, model, depth, w + args.steps)][0] - counts[(arm, model, depth, w)][0])
            / args.steps
            for arm in arms
        }
        rested = {
            arm: counts[(arm, model, depth, w + args.steps)][1] - counts[(arm, model, depth, w)][1]
            for arm in arms
        }
        ns_per = natives[(model, depth)] * 1e9 / per["plain"]
        label = f"{depth}-block MLP" if model == "mlp" else f"tiny Llama, {depth} layers"
        print(
            f"  {label}, steps {w} to {w + args.steps}: plain {per['plain'] / 1e6:.3f} M instructions a step,"
            f" {natives[(model, depth)] * 1e3:.2f} ms native ({ns_per:.3f} ns an instruction)"
        )
        for arm in arms[1:]:
            extra = per[arm] - per["plain"]
            print(
                f"    {arm:7s} {extra / 1e3:+9.1f} k instructions a step ({extra / per['plain']:+.3%}), "
                f"{extra * ns_per / 1e3:+7.1f} µs at the plain step's rate"
                + (f"; {rested[arm]} of {args.steps} measured steps rested" if arm != "import" else "")
            )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
    else:
        main()
