"""A small real distributed training job for the tests: DDP (optionally ``gradient_as_bucket_view``) or
FSDP2 (``fully_shard`` on each Linear and on the model), AdamW, gloo on CPU, under ``torchrun``. With
``--model llama`` the model is a tiny Llama built from ``tiny_llama/config.json`` (FSDP2 on each decoder layer
and the root, as torchtitan and accelerate wrap), so ``anatomy-top plan tiny_llama --fsdp 2`` can be checked
against what rank 0 published (tests/distributed/test_plan_ranks.py). Each rank
trains with the anatomy hook, then writes its independent ground truth (storage bytes it holds, counted
here from the tensors themselves: local shards through ``DTensor.to_local()``, DDP's buckets) to
``<out>/truth-<rank>.json`` and lingers, publishing, until ``<out>/stop`` exists.

    torchrun --standalone --nproc-per-node 2 tests/distributed/dist_train.py --mode fsdp2 --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anatomy

WIDTH = 256
DEPTH = 4


CONFIG_DIR = Path(__file__).resolve().parent / "tiny_llama"
SEQ_LEN = 32


def build_llama() -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(CONFIG_DIR))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(self.norm(x))


def local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def storage_sum(tensors: list[torch.Tensor]) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        t = local(t)
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            continue
        key = storage.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


class SavedOracle:
    """The test's own count of what the step saves for backward (a user's saved_tensors_hooks, which the
    hook composes with): storages of saved tensors, each once, that are neither the model's parameters
    (local shards) nor an all-gathered parameter (FSDP swaps an nn.Parameter in for the forward) nor the
    batch."""

    def __init__(self, model: nn.Module, batch: list[torch.Tensor]) -> None:
        self.skip = {local(p).untyped_storage().data_ptr() for p in model.parameters()}
        self.skip |= {t.untyped_storage().data_ptr() for t in batch}
        self.storages: dict[int, int] = {}
        self.gathered: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        base = t._base if t._base is not None else t  # a view's base tensor: torch names it nowhere public
        if isinstance(base, nn.Parameter):
            self.gathered[storage.data_ptr()] = storage.nbytes()
        elif storage.data_ptr() not in self.skip:
            self.storages.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


def unsharded_now(model: nn.Module) -> int:
    """Bytes of FSDP2's all-gathered parameters allocated right now, from FSDP's own records (private
    attributes: a test's independent count, not an API the hook uses)."""
    from torch.distributed.fsdp import FSDPModule

    total = 0
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        # FSDP2 keeps its gathered parameters in private state: torch has no public way to ask for them.
        group = module._get_fsdp_state()._fsdp_param_group
        for fsdp_param in group.fsdp_params if group is not None else []:
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if unsharded is not None:
                total += unsharded.untyped_storage().nbytes()
    return total


def truth(model: nn.Module, optimizer: torch.optim.Optimizer, ddp: Any) -> dict[str, int]:
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    states = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    out = {
        "weights": storage_sum(params) + storage_sum(list(model.buffers())),
        "gradients": storage_sum(grads),
        "optimizer_states": storage_sum(states),
        "parameter_count": sum(local(p).numel() for p in params),
        "full_parameter_count": sum(p.numel() for p in params),
    }
    if ddp is not None:
        # DDP's reducer: one flat bucket per group of parameters, the size of their gradients (its logging
        # data, private, is the one place torch gives the bucket sizes).
        sizes = ddp._get_ddp_logging_data()["bucket_sizes"]
        out["ddp_buckets"] = sum(int(x) for x in str(sizes).replace(",", " ").split())
        out["ddp_bucket_view"] = int(bool(ddp.gradient_as_bucket_view))
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["ddp", "ddp-bucket-view", "fsdp2"], required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--no-hook", action="store_true")
    p.add_argument("--model", choices=["net", "llama"], default="net")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    llama = args.model == "llama"
    model: nn.Module = build_llama() if llama else Net()
    ddp = None
    if args.mode.startswith("ddp"):
        ddp = nn.parallel.DistributedDataParallel(
            model, gradient_as_bucket_view=args.mode == "ddp-bucket-view"
        )
        wrapped: nn.Module = ddp
    else:
        from torch.distributed.fsdp import fully_shard

        blocks = list(model.model.layers) if llama else [*model.layers, model.head]  # type: ignore[union-attr]
        for layer in blocks:
            fully_shard(layer)
        fully_shard(model)
        wrapped = model
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    tracker = None if args.no_hook else anatomy.track(wrapped, optimizer, sample_every=2, interval_s=0.05)
    gen = torch.Generator().manual_seed(rank)
    losses = []
    if llama:
        return train_llama(args, model, wrapped, optimizer, tracker, ddp, rank)
    oracle: SavedOracle | None = None
    gathered_after_forward = 0
    for step in range(args.steps):
        x = torch.randn(args.batch, WIDTH, generator=gen)
        y = torch.randint(0, 16, (args.batch,), generator=gen)
        last = step == args.steps - 1
        with tracker.step(samples=args.batch) if tracker is not None else contextlib.nullcontext():
            if last:  # the truth of what the step saves, counted by the test itself
                oracle = SavedOracle(model, [x, y])
                with torch.autograd.graph.saved_tensors_hooks(oracle.pack, oracle.unpack):
                    loss = nn.functional.cross_entropy(wrapped(x), y)
                gathered_after_forward = unsharded_now(model) if args.mode == "fsdp2" else 0
            else:
                loss = nn.functional.cross_entropy(wrapped(x), y)
            loss.backward()
            optimizer.step()
        losses.append(float(loss.detach()))
        # no zero_grad: the gradients (and DDP's buckets) stay allocated for the truth below
    facts = truth(model, optimizer, ddp)
    assert oracle is not None
    facts["activations"] = sum(oracle.storages.values())
    facts["unsharded_after_forward"] = gathered_after_forward
    facts["gathered_saved"] = sum(oracle.gathered.values())
    facts.update(rank=rank, pid=os.getpid(), losses=losses)
    return finish(args, facts, tracker)


def train_llama(
    args: argparse.Namespace,
    model: nn.Module,
    wrapped: nn.Module,
    optimizer: Any,
    tracker: Any,
    ddp: Any,
    rank: int,
) -> int:
    """A plain loop as `anatomy-top plan` plans it: zero_grad(set_to_none) at the step's start, `out` bound
    until the next forward returns (the config has use_cache off: no KV cache)."""
    gen = torch.Generator().manual_seed(rank)
    losses = []
    out: Any = None
    oracle: SavedOracle | None = None
    gathered_after_forward = 0
    for step in range(args.steps):
        x = torch.randint(100, 1001, (args.batch, SEQ_LEN), generator=gen)
        with tracker.step(samples=args.batch) if tracker is not None else contextlib.nullcontext():
            optimizer.zero_grad(set_to_none=True)
            if step == args.steps - 1:  # the truth of what the step saves, counted by the test itself
                oracle = SavedOracle(model, [x])
                with torch.autograd.graph.saved_tensors_hooks(oracle.pack, oracle.unpack):
                    out = wrapped(input_ids=x, labels=x)
                # what FSDP keeps gathered from the forward into backward (the root's parameters)
                gathered_after_forward = unsharded_now(model) if args.mode == "fsdp2" else 0
            else:
                out = wrapped(input_ids=x, labels=x)
            out.loss.backward()
            optimizer.step()
        losses.append(float(out.loss.detach()))
    facts = truth(model, optimizer, ddp)
    assert oracle is not None
    facts["activations"] = sum(oracle.storages.values())
    facts["unsharded_after_forward"] = gathered_after_forward
    facts["gathered_saved"] = sum(oracle.gathered.values())
    facts.update(rank=rank, pid=os.getpid(), losses=losses)
    return finish(args, facts, tracker)


def finish(args: argparse.Namespace, facts: dict[str, Any], tracker: Any) -> int:
    """Write this rank's truth, then linger (publishing) until the test says stop."""
    rank = facts["rank"]
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / f"truth-{rank}.json.tmp"
    tmp.write_text(json.dumps(facts))
    tmp.rename(args.out / f"truth-{rank}.json")
    deadline = time.monotonic() + 120
    while not (args.out / "stop").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if tracker is not None:
        tracker.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
