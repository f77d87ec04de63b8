"""A real, small training job on CPU, instrumented with the anatomy hook: what ``anatomy-top --demo`` shows.

Run as its own process (``python -m tui.demo_train``): it is the one module under ``tui/`` that imports
torch, and the monitor never imports it. A BERT-style classifier built from a config (random weights,
nothing downloaded) trains on random token ids with AdamW, one thread, until killed or ``--steps``.
Its default size (hidden 384, 4 layers: ~19 M parameters, ~0.4 s a step on one CPU thread) makes the
training components — weights, optimizer states, gradients, activations — dominate the memory bar over
what the interpreter and libraries hold.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from types import FrameType

EXIT_NO_TORCH = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tui.demo_train", description=__doc__)
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: run until killed)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda:0 (the demo itself runs on CPU)")
    p.add_argument(
        "--pause", type=float, default=0.0, help="seconds to sleep between steps, to keep a demo light on CPU"
    )
    p.add_argument("--interval", type=float, default=0.5, help="publish interval of the hook")
    p.add_argument("--sample-every", type=int, default=20, help="op-group sampling period in steps")
    p.add_argument("--oom-at-step", type=int, default=0, help="raise torch.OutOfMemoryError on this step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--linger",
        action="store_true",
        help="after --steps, keep publishing the last snapshot until killed (frozen figures for tests)",
    )
    return p.parse_args(argv)


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    # Turn SIGTERM/SIGHUP into a normal exit so the hook closes and removes its socket.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
        from transformers import BertConfig, BertForSequenceClassification

        import anatomy
    except ImportError as exc:
        print(
            f"anatomy-top demo: the training job needs the 'train' extra "
            f"(pip install 'anatomy-top[train]'): {exc}",
            file=sys.stderr,
        )
        return EXIT_NO_TORCH
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)

    torch.set_num_threads(max(1, args.threads))
    torch.manual_seed(args.seed)
    config = BertConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        intermediate_size=4 * args.hidden,
        max_position_embeddings=max(512, args.seq),
        num_labels=2,  # type: ignore[call-arg]  # a PretrainedConfig kwarg
    )
    try:
        device = torch.device(args.device)
        torch.empty(1, device=device)
    except (RuntimeError, AssertionError) as exc:  # torch says "not compiled with CUDA" with an assert
        print(f"demo_train: device {args.device!r} is not usable: {exc}", file=sys.stderr)
        return 2
    model: torch.nn.Module = BertForSequenceClassification(config)
    model = model.to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tracker = anatomy.track(model, optimizer, interval_s=args.interval, sample_every=args.sample_every)
    step = 0
    try:
        while args.steps <= 0 or step < args.steps:
            step += 1
            if args.linger and step == args.steps and step > 1:
                # The hook publishes at most once per interval: make the last step's snapshot due.
                time.sleep(args.interval)
            # The guide's dummy data: token ids in 100..30000, binary labels.
            ids = torch.randint(100, min(30000, args.vocab), (args.batch, args.seq), device=device)
            labels = torch.randint(0, 2, (args.batch,), device=device)
            with tracker.step(samples=args.batch, tokens=args.batch * args.seq):
                out = model(input_ids=ids, labels=labels)
                out.loss.backward()
                if args.oom_at_step and step == args.oom_at_step:
                    raise torch.OutOfMemoryError("CUDA out of memory (simulated by the anatomy-top demo)")
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if args.pause > 0:
                time.sleep(args.pause)
        if args.linger:
            print(f"demo_train: {step} steps done, lingering", flush=True)
        while args.linger:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 130
    finally:
        with contextlib.suppress(Exception):
            tracker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
