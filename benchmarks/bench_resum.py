"""What a re-sum of the weights costs (``_refresh_weights``: weight bytes by dtype, the parameters
re-learnt for the saved-tensor counter, the change watches, the count, the dtype), against one walk of the
model's parameters (``list(model.parameters())``) in the same process.

A re-sum runs on the first steps, one step in ``sample_every`` (a sampled step's) and on every change the
hooks see; it answers to the hook's budget, and it is part of what a sampled step holds the loop back by.
Run it at two commits (``PYTHONPATH``) to compare them: the walk is each run's own yardstick.

    .venv/bin/python benchmarks/bench_resum.py [--reps 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import anatomy


def mlp(blocks: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        *[
            torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
            for _ in range(blocks)
        ]
    )


def llama(layers: int) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
                         num_hidden_layers=layers, vocab_size=1024)  # fmt: skip
    return LlamaForCausalLM(config)


def timed(fn: Callable[[], object], reps: int) -> float:
    """The median µs of ``fn`` over ``reps`` calls, in blocks of 5."""
    samples = []
    for _ in range(max(1, reps // 5)):
        began = time.perf_counter()
        for _ in range(5):
            fn()
        samples.append((time.perf_counter() - began) / 5 * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"anatomy from {Path(anatomy.__file__).parent}; torch {torch.__version__}")
    for name, make in (
        ("2-block MLP", lambda: mlp(2)),
        ("32-block MLP", lambda: mlp(32)),
        ("tiny Llama, 8 layers", lambda: llama(8)),
        ("tiny Llama, 32 layers", lambda: llama(32)),
    ):
        torch.manual_seed(0)
        model = make()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        tracker = anatomy.track(model, opt, directory=Path(tempfile.mkdtemp()))
        walk = timed(lambda m=model: list(m.parameters()), args.reps)
        resum = timed(tracker._refresh_weights, args.reps)
        modules = sum(1 for _ in model.modules())
        print(
            f"  {name:<22} {modules:5d} modules: a re-sum {resum:9.1f} µs, a walk of the parameters"
            f" {walk:7.1f} µs, the re-sum {resum / walk:5.1f} walks"
        )
        tracker.close()


if __name__ == "__main__":
    main()
