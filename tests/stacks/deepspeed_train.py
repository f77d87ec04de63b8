"""A DeepSpeed ZeRO training run on CPU, with and without the anatomy hook; prints one JSON document.

Run by tests/stacks/test_deepspeed.py as ``python deepspeed_train.py STAGE DTYPE [STAGE DTYPE ...]``, one
process for every configuration (``torch.distributed`` is initialised once, single rank, gloo), or under
``torchrun --standalone --nproc-per-node 2`` (then every rank reports, keyed ``STAGE-DTYPE@RANK``). For each
configuration: the losses of a run without the hook, the same run with it, the hook's figures, and an
independent count of DeepSpeed's own tensors made here, at the moments the hook measures: gradients just
before ``engine.step()`` (DeepSpeed's gradient buffers then), weights and optimizer states after it.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29531")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")

import deepspeed
import deepspeed.ops
import torch

import anatomy

# DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce kernel at its first initialize (about
# 100 s here); gloo does the (single-rank) collectives just as well, so it is marked unavailable.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

STEPS = 4
BATCH = 8
HIDDEN = 64


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(HIDDEN, 4 * HIDDEN),
        torch.nn.GELU(),
        torch.nn.LayerNorm(4 * HIDDEN),
        torch.nn.Linear(4 * HIDDEN, HIDDEN),
    )


def optimizer(net: torch.nn.Module) -> torch.optim.Optimizer:
    # Two parameter groups, as the Trainer makes (decay / no decay): DeepSpeed steps its torch optimizer once
    # per group inside one update.
    decay = [p for n, p in net.named_parameters() if n.endswith("weight") and p.dim() == 2]
    rest = [p for n, p in net.named_parameters() if not (n.endswith("weight") and p.dim() == 2)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}])


def config(stage: int, dtype: str, accum: int = 1) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": BATCH,
        "gradient_accumulation_steps": accum,
        "zero_allow_untested_optimizer": True,
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
    }
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def storages(tensors: list[torch.Tensor]) -> int:
    """Bytes of distinct storages, by data pointer (the independent count: no anatomy code)."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flat(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flat(v)]
    return []


def independent(zopt: Any, stage: int, net: torch.nn.Module) -> dict[str, int]:
    """Weights, optimizer states (torch's moments and steps + DeepSpeed's fp32 master partitions)."""
    if stage == 3:
        weights = flat(zopt.fp16_partitioned_groups_flat)
        masters = flat(zopt.fp32_partitioned_groups_flat)
    else:
        weights = flat(zopt.bit16_groups_flat)
        masters = flat(zopt.single_partition_of_fp32_groups)
    states = flat(list(zopt.optimizer.state.values()))
    buckets = [t for b in zopt.ipg_buckets.values() for t in flat(b.buffer)]
    return {
        "buckets": storages(buckets),
        "weights": storages(weights + list(net.buffers())),
        "masters": storages(masters),
        "moments": storages(states),
        "optimizer_states": storages(states + masters),
    }


def gradients_now(zopt: Any, stage: int) -> int:
    if stage == 3:
        return storages(flat(zopt.grad_partitions_flat_buffer))
    return storages(flat(zopt.averaged_gradients))


def run(stage: int, dtype: str, hooked: bool, accum: int = 1) -> dict[str, Any]:
    """STEPS optimizer updates of ``accum`` micro-batches each: ``engine.backward``/``engine.step`` and the
    tracker's step around every micro-batch (DeepSpeed updates on the last one of each ``accum``)."""
    net = model()
    engine, zopt, _, _ = deepspeed.initialize(
        model=net, optimizer=optimizer(net), config=config(stage, dtype, accum)
    )
    tracker = anatomy.track(engine.module, engine.optimizer, publish=False) if hooked else None
    dt = torch.bfloat16 if dtype == "bf16" else torch.float32
    gen = torch.Generator().manual_seed(1)
    losses: list[float] = []
    grads: list[int] = []
    updates = 0
    for _ in range(STEPS * accum):
        x = torch.randn(BATCH, HIDDEN, generator=gen).to(dt)
        y = torch.randn(BATCH, HIDDEN, generator=gen).to(dt)
        ctx = tracker.step(samples=BATCH) if tracker is not None else None
        if ctx is not None:
            ctx.__enter__()
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        if engine.is_gradient_accumulation_boundary():  # the ZeRO optimizer steps in this engine.step()
            grads.append(gradients_now(zopt, stage))
            updates += 1
        engine.step()
        if ctx is not None:
            ctx.__exit__(None, None, None)
        losses.append(float(loss.detach().float()))
    out: dict[str, Any] = {"losses": losses}
    if tracker is not None:
        snap = tracker.latest
        hello = tracker.hello
        assert snap is not None
        out.update(
            hook=snap.memory,
            expected=snap.expected_bytes_per_param,
            steps=snap.step + 1,
            updates=updates,
            micro_batches=snap.grad_accum_steps,
            accum=accum,
            error=snap.error,
            parameter_count=hello.parameter_count,
            precision=hello.precision,
            optimizer=hello.optimizer,
            independent=independent(zopt, stage, engine.module),
            gradients=max(grads),
            numel=sum(
                p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in engine.module.parameters()
            ),
            world_size=torch.distributed.get_world_size(),
            zero_class=type(zopt).__name__,
            reduce_bucket_bytes=int(zopt.reduce_bucket_size) * (2 if dtype == "bf16" else 4),
            torch_optimizer=type(zopt.optimizer).__name__,
        )
        tracker.close()
    engine.destroy()
    return out


def trainer_run(stage: int, dtype: str, hooked: bool, accum: int = 1) -> dict[str, Any]:
    """The Hugging Face Trainer with ``TrainingArguments(deepspeed=config)`` and a tiny Llama from a config.
    An independent count, taken by a callback listed before the AnatomyCallback, wraps the ZeRO optimizer's
    ``step`` (so the hook's wrapper calls it): DeepSpeed's gradient buffers as the step begins."""
    import tempfile

    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    class Count(TrainerCallback):
        def __init__(self) -> None:
            self.grads: list[int] = []
            self.zopt: Any = None

        def on_train_begin(
            self, args: Any, state: Any, control: Any, optimizer: Any = None, **kw: Any
        ) -> None:
            zopt = optimizer.optimizer  # accelerate's DeepSpeedOptimizerWrapper around the ZeRO optimizer
            self.zopt = zopt
            step = zopt.step

            def counted(*a: Any, **k: Any) -> Any:  # once per update: the ZeRO optimizer's step
                self.grads.append(gradients_now(zopt, stage))
                return step(*a, **k)

            zopt.step = counted

    class Batches(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 4 * BATCH

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            ids = torch.randint(0, 128, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    net = LlamaForCausalLM(cfg)
    ds = config(stage, dtype)
    ds["train_micro_batch_size_per_gpu"] = "auto"
    ds["gradient_accumulation_steps"] = "auto"
    count = Count()
    callbacks: list[Any] = [count]
    if hooked:
        callbacks.append(anatomy.AnatomyCallback(publish=False))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=BATCH,
            gradient_accumulation_steps=accum,
            max_steps=STEPS,
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            deepspeed=ds,
            bf16=dtype == "bf16",
            use_cpu=True,
            seed=0,
            data_seed=0,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = Trainer(model=net, args=args, train_dataset=Batches(), callbacks=callbacks)
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    result: dict[str, Any] = {"losses": losses}
    if hooked:
        tracker = callbacks[-1].tracker
        snap = tracker.latest
        zopt = count.zopt
        result.update(
            hook=snap.memory,
            steps=snap.step + 1,
            updates=len(count.grads),
            micro_batches=snap.grad_accum_steps,
            accum=accum,
            global_step=trainer.state.global_step,
            error=snap.error,
            precision=tracker.hello.precision,
            independent=independent(zopt, stage, trainer.model),
            gradients=max(count.grads),
            parameter_count=tracker.hello.parameter_count,
            expected=snap.expected_bytes_per_param,
            zero_class=type(zopt).__name__,
            groups=len(zopt.optimizer.param_groups),
            numel=sum(p.numel() for p in trainer.model.parameters()),
            world_size=1,
        )
    trainer.model_wrapped.destroy()
    return result


def main(argv: list[str]) -> None:
    results: dict[str, Any] = {}
    for stage_arg, dtype in zip(argv[::2], argv[1::2], strict=True):
        trainer = stage_arg.startswith("trainer")
        accum = 2 if stage_arg.endswith("ga") else 1  # "2ga": stage 2, two micro-batches per update
        stage = int(stage_arg.removeprefix("trainer").removesuffix("ga"))
        fn = trainer_run if trainer else run
        plain = fn(stage, dtype, hooked=False, accum=accum)
        hooked = fn(stage, dtype, hooked=True, accum=accum)
        key = f"{stage_arg}-{dtype}"
        if torch.distributed.get_world_size() > 1:  # under torchrun: one result per rank
            key += f"@{torch.distributed.get_rank()}"
        results[key] = {**hooked, "plain_losses": plain["losses"]}
    # One file per rank, in the job's own directory: two ranks printing long lines to one pipe interleave.
    rank = torch.distributed.get_rank() if torch.distributed.get_world_size() > 1 else 0
    part = f"result-{rank}.json.part"
    with open(part, "w") as f:
        json.dump(results, f)
    os.replace(part, f"result-{rank}.json")
    # Every rank leaves together: a rank exiting while its peer still talks to it makes gloo abort the peer.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    # The results are on disk: skip the interpreter's teardown, where a C++ thread still joinable at exit
    # aborted a rank now and then ("terminate called without an active exception", exit -6).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
