"""What an ordinary step of the hook costs against the least any Python step context costs, in whole processes
interleaved one step at a time on one CPU (the issue's protocol), with several processes per arm.

One process per arm (``bench_hook_versions.py``) carries that process's own offset — where its pages landed,
what its neighbours evict — of ±20-30 µs a step on this box, as large as what is measured here; so each arm
runs in ``--procs`` processes, every round runs every process once in a shuffled order, and an arm's step
time per round is the mean over its processes. Arms, all timing the training thread's CPU time of one step of
a 2-block MLP (AdamW, told its samples as README's loop tells it):

- ``plain``: no hook (the baseline);
- ``context``: a trivial context manager around the step, reading the clock as it enters and exits — the
  least any step context costs (the with statement, two calls, two clock reads, cold after the switch);
- ``idle``: the tracker attached with its hooks resting and never told a step — what its presence costs;
- ``hooked``: ``with tracker.step(samples=...)`` (ordinary steps rest: no hook of ours between begin and end).

Printed per arm: the median step, the median per-round difference to ``plain`` and each process's own.

What is timed (``--part``): ``all``, the whole step with its context; ``ours``, only the context's entry and
exit (the hook's begin and end: the plain arm's are a ``nullcontext``'s); ``torch``, only the training step
between them. With ``--burst N`` a process runs N steps a turn and reports the median of the last ones (the
first ``N // 4 + 1`` dropped): its caches warm again after the switch, as a job running alone keeps them —
with one step a turn (the default) every step finds the hook's code and data as cold as the other
processes left them.

Usage: python benchmarks/bench_hook_floor.py [--blocks 2] [--rounds 1500] [--procs 3] [--cpu 1]
       [--part all|ours|torch] [--burst 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("plain", "context", "idle", "hooked")
PARTS = {
    "all": "",
    "ours": " of the context's entry and exit only",
    "torch": " of the step inside the context only",
}

WORKER = r"""
import contextlib, sys, time
from time import perf_counter
arm, blocks, root = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, root)
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
def block():
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
model = torch.nn.Sequential(*[block() for _ in range(blocks)])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(16, 64)

class Context:
    def __enter__(self):
        self.t = perf_counter()
    def __exit__(self, *exc):
        self.s = perf_counter() - self.t
        return False

context, tracker = contextlib.nullcontext(), None
if arm == "context":
    context = Context()
elif arm in ("idle", "hooked"):
    import anatomy
    tracker = anatomy.track(model, opt, publish=False, sample_every=10**9)
    if arm == "idle":
        tracker._hooks_off()
part, burst = sys.argv[4], int(sys.argv[5])
for line in sys.stdin:
    took = []
    for _ in range(burst):
        c0 = time.thread_time_ns()
        ctx = tracker.step(samples=16) if arm == "hooked" else context
        ctx.__enter__()
        c1 = time.thread_time_ns()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        c2 = time.thread_time_ns()
        ctx.__exit__(None, None, None)
        c3 = time.thread_time_ns()
        took.append(c3 - c0 if part == "all" else c1 - c0 + c3 - c2 if part == "ours" else c2 - c1)
    took = sorted(took[burst // 4 + 1 :] if burst > 1 else took)
    sys.stdout.write(f"{took[len(took) // 2]}\n")
    sys.stdout.flush()
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1500)
    parser.add_argument("--procs", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=1, help="the CPU every worker runs on (-1: not pinned)")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--part", choices=tuple(PARTS), default="all", help="what is timed")
    parser.add_argument("--burst", type=int, default=1, help="steps a process runs a turn")
    args = parser.parse_args()
    names = [(arm, k) for k in range(args.procs) for arm in ARMS]
    cmd = [sys.executable, "-c", WORKER]
    if args.cpu >= 0:  # (-1: not pinned)
        cmd = ["taskset", "-c", str(args.cpu), *cmd]
    procs = {
        name: subprocess.Popen(
            [*cmd, name[0], str(args.blocks), str(ROOT), args.part, str(args.burst)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        for name in names
    }
    times: dict[tuple[str, int], list[int]] = {name: [] for name in names}
    order = list(names)
    rng = random.Random(0)
    for _ in range(args.rounds + args.warmup):
        rng.shuffle(order)  # (no arm always runs right after another)
        for name in order:
            p = procs[name]
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("\n")
            p.stdin.flush()
            times[name].append(int(p.stdout.readline()))
    for p in procs.values():
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    w = args.warmup
    rounds = range(w, w + args.rounds)
    per_arm = {
        arm: [statistics.mean(times[(arm, k)][i] for k in range(args.procs)) for i in rounds] for arm in ARMS
    }
    plain = per_arm["plain"]
    print(
        f"hook floor: {args.blocks}-block MLP, {args.rounds} rounds, {args.procs} processes per arm, "
        f"{f'all on CPU {args.cpu}' if args.cpu >= 0 else 'not pinned'}, training-thread CPU"
        f"{PARTS[args.part]}"
        f"{'' if args.burst == 1 else f', {args.burst} steps a turn'}"
    )
    for arm in ARMS:
        extra = statistics.median(a - b for a, b in zip(per_arm[arm], plain, strict=True)) / 1e3
        own = [
            statistics.median(a - b for a, b in zip(times[(arm, k)][w:], plain, strict=True)) / 1e3
            for k in range(args.procs)
        ]
        each = ", ".join(f"{e:+.0f}" for e in own)
        step = statistics.median(per_arm[arm]) / 1e3
        print(f"  {arm:8s} step {step:8.1f} µs   extra {extra:+7.1f} µs   per process {each}")


if __name__ == "__main__":
    main()
