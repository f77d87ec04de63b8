"""Where an ordinary hooked CUDA step's extra host time goes, and how the hook's steps ended: a 2-block MLP
and a 2-layer tiny Llama on ``cuda:0``, each trained without and with the hook (publishing, sampled steps
off). Prints µs per step (wall, training-thread CPU), the count of each way a hooked step ended (a lean end,
a promotion and the stage it happened at, a repeated or built snapshot, the end-of-step allocator check and
what it read where it failed), then ``cProfile`` of the same steps with and without the hook: per function,
its time per step with the hook minus without (the largest both ways). Needs a GPU; without one it says so
and exits 0 (``--device cpu`` runs it on the CPU, for the script's own sake).

Usage: python benchmarks/profile_cuda_lean.py [--steps 300] [--device cuda] [--told]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import pstats
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import anatomy
from anatomy.hook.backend import CudaBackend
from anatomy.hook.ordinary import OrdinarySteps
from anatomy.hook.resting import RestingSteps
from anatomy.hook.snapshots import StepSnapshots

COUNTS: collections.Counter[str] = collections.Counter()
MISSES: list[Any] = []  # what the end-of-step check read where it failed, and what it compared with


def _counted(cls: type, name: str) -> None:
    real = getattr(cls, name)

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        if name == "_promote":
            COUNTS[f"promoted at stage {self._lean.stage}"] += 1
        out = real(self, *args, **kwargs)
        if name == "lean_steady" and not out:
            MISSES.append((self.allocator.current_and_peak(), self.steady))
        COUNTS[f"{name}={out}" if isinstance(out, bool) else name] += 1
        return out

    setattr(cls, name, counting)


# What a step is told with --told (the README's loop): samples, and tokens where the batch has them.
TOLD = {"mlp": {"samples": 4}, "llama": {"samples": 4, "tokens": 4 * 32}}


def _model(kind: str, dev: torch.device) -> tuple[torch.nn.Module, Callable[[], torch.Tensor]]:
    torch.manual_seed(0)
    if kind == "mlp":
        layers: list[torch.nn.Module] = []
        for _ in range(2):
            layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
        mlp = torch.nn.Sequential(*layers).to(dev)
        x = torch.randn(4, 64, device=dev)
        return mlp, lambda: mlp(x).sum()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=2,
        vocab_size=1024,
    )
    llama: torch.nn.Module = LlamaForCausalLM(config)
    llama.to(dev)
    ids = torch.randint(0, 1024, (4, 32), device=dev)
    return llama, lambda: llama(input_ids=ids, labels=ids).loss


def _where(key: tuple[str, int, str]) -> str:
    path = key[0].split("site-packages/")[-1]
    return f"{path}:{key[1]}({key[2]})"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--told", action="store_true", help="steps told their samples and tokens (they may rest)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("profile_cuda_lean: no CUDA device here; nothing measured")
        return
    sync: Callable[[], None] = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for cls, name in [
        (OrdinarySteps, "_promote"),
        (OrdinarySteps, "_end_ordinary"),
        (StepSnapshots, "_build"),
        (StepSnapshots, "_repeat"),
        (CudaBackend, "lean_steady"),
        (RestingSteps, "_rest_begin"),
    ]:
        _counted(cls, name)
    n = args.steps
    for kind in ("mlp", "llama"):
        own: dict[bool, dict[Any, float]] = {}
        for hooked in (False, True):
            model, loss = _model(kind, dev)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            tracker = None
            if hooked:
                tracker = anatomy.track(model, opt, directory=Path(tempfile.mkdtemp()), sample_every=10**9)

            def step(
                opt: torch.optim.Optimizer = opt,
                loss: Callable[[], torch.Tensor] = loss,
                tracker: anatomy.Tracker | None = tracker,
                told: dict[str, int] = TOLD[kind] if args.told else {},
            ) -> None:
                with tracker.step(**told) if tracker is not None else contextlib.nullcontext():
                    loss().backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

            for _ in range(60):
                step()
            sync()
            COUNTS.clear()
            MISSES.clear()
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(n):
                step()
            sync()
            wall, cpu = (time.perf_counter() - t0) / n * 1e6, (time.thread_time() - c0) / n * 1e6
            print(f"{kind} hooked={hooked}: {wall:.0f} µs wall, {cpu:.0f} µs thread CPU per step", flush=True)
            if hooked:
                print(f"  how the steps ended: {dict(COUNTS)}; failed checks: {MISSES[:4]}", flush=True)
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(n):
                step()
            profile.disable()
            sync()
            stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
            own[hooked] = {key: value[2] for key, value in stats.items()}
            if tracker is not None:
                tracker.close()
        keys = set(own[True]) | set(own[False])
        diff = sorted(((own[True].get(k, 0.0) - own[False].get(k, 0.0)) / n * 1e6, k) for k in keys)
        plain, hooked_total = (sum(own[h].values()) / n * 1e6 for h in (False, True))
        print(f"  under cProfile: {plain:.0f} µs a step without the hook, {hooked_total:.0f} µs with it")
        for d, key in [*diff[::-1][:20], *diff[:4]]:
            print(f"  {d:+8.1f} µs  {_where(key)}")


if __name__ == "__main__":
    main()
