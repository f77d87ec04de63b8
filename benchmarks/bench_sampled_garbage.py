"""The garbage a deep model's sampled steps make: a tiny Llama (bench_resum's) trained in fresh processes —
plain, the working tree's hook, and with ``--base REV`` (or ``--base-dir``) the hook as that revision had
it — for ``--steps`` steps (its first sampled episodes: the op-group profiler and the per-op trace, in
pieces over consecutive steps), counting the garbage collector's collections of each generation on every
step (``gc.callbacks``). Issue 19 asks that the hook cause no gen-2 collection the plain loop does not have;
a gen-2 collection walks every object of the process (a few hundred ms with transformers loaded).

Printed per arm: collections per generation over the run, and per step of each kind (ordinary, profiled
piece, traced piece), summed over ``--rounds`` processes; the hooked arms against plain.

Usage: python benchmarks/bench_sampled_garbage.py [--layers 32] [--steps 60] [--rounds 2] [--base REV]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_hook_versions import export, worker_env

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("ordinary", "profile", "trace")


def _worker(hooked: bool, layers: int, steps: int) -> None:
    import contextlib
    import gc

    import torch
    from bench_resum import llama

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = llama(layers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1024, (2, 32), generator=torch.Generator().manual_seed(1))
    counts = [0, 0, 0]

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            counts[info["generation"]] += 1

    kinds: dict[int, str] = {}
    tracker = None
    if hooked:
        import anatomy
        from anatomy.hook.sampled import SampledSteps

        original = SampledSteps._start_sampled

        def start(self: object, rec: object, kind: str) -> None:
            kinds[rec.index] = kind  # type: ignore[attr-defined]
            original(self, rec, kind)  # type: ignore[arg-type]

        SampledSteps._start_sampled = start  # type: ignore[method-assign]
        tracker = anatomy.track(model, opt, directory=Path(tempfile.mkdtemp()))
    gc.collect()
    gc.callbacks.append(count)
    per_kind = {k: [0, 0, 0] for k in KINDS}
    steps_of = dict.fromkeys(KINDS, 0)
    for i in range(steps):
        before = list(counts)
        with tracker.step(samples=2) if tracker is not None else contextlib.nullcontext():
            model(ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        kind = kinds.get(i, "ordinary")
        steps_of[kind] += 1
        for g in range(3):
            per_kind[kind][g] += counts[g] - before[g]
    gc.callbacks.remove(count)
    if tracker is not None:
        tracker.close()
    print(json.dumps({"total": counts, "per_kind": per_kind, "steps": steps_of}))


def _run(src: Path | None, layers: int, steps: int) -> dict[str, object]:
    args = [sys.executable, __file__, "--worker", "hooked" if src else "plain"]
    args += ["--layers", str(layers), "--steps", str(steps)]
    env = worker_env(src or ROOT)
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1800, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per arm (rotating order)")
    ap.add_argument("--base", default=None, help="the hook at this git revision too")
    ap.add_argument("--base-dir", type=Path, default=None, help="the base's package already exported here")
    ap.add_argument("--worker", choices=["plain", "hooked"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker == "hooked", args.layers, args.steps)
        return
    with tempfile.TemporaryDirectory() as tmp:
        arms: dict[str, Path | None] = {"plain": None, "this": ROOT}
        base = args.base_dir.resolve() if args.base_dir else None
        if base is None and args.base:
            base = export(args.base, Path(tmp))
        if base is not None:
            arms["base"] = base
        names = list(arms)
        got: dict[str, list[dict[str, object]]] = {a: [] for a in names}
        for r in range(args.rounds):
            for arm in names[r % len(names) :] + names[: r % len(names)]:
                got[arm].append(_run(arms[arm], args.layers, args.steps))
    print(
        f"tiny Llama, {args.layers} layers, {args.steps} steps, {args.rounds} process(es) per arm: "
        "gc collections (gen 0/1/2), summed over the processes"
    )
    for arm in names:
        runs = got[arm]
        total = [sum(int(r["total"][g]) for r in runs) for g in range(3)]  # type: ignore[index]
        parts = []
        for kind in KINDS:
            n = sum(int(r["steps"][kind]) for r in runs)  # type: ignore[index]
            if n:
                c = [sum(int(r["per_kind"][kind][g]) for r in runs) for g in range(3)]  # type: ignore[index]
                parts.append(f"{kind} {n} steps {c[0]}/{c[1]}/{c[2]} ({c[0] / n:.2f} gen-0 a step)")
        print(f"  {arm:5s}: all {total[0]}/{total[1]}/{total[2]}; " + "; ".join(parts))


if __name__ == "__main__":
    main()
