"""A Hugging Face Trainer job under torchrun (DDP on CPU, gloo) with the AnatomyCallback: a tiny BERT
from a config (nothing downloaded). At the end of training every rank writes ``<out>/rank-<r>.json``
(its PID and parameter bytes) and waits for ``<out>/stop`` before the callback closes its tracker, so
the test can read every rank's socket.

    torchrun --standalone --nproc-per-node 2 tests/distributed/trainer_train.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from anatomy import AnatomyCallback


class Batches(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 1000, (32,), generator=g), "labels": torch.tensor(i % 2)}


class Linger(TrainerCallback):
    """Listed before the AnatomyCallback: holds every rank at the end, publishing, until told to stop."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        rank = int(os.environ.get("RANK", "0"))
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.parameters()}
        storages.update(
            {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.buffers()}
        )
        weights = sum(storages.values())
        facts = {"rank": rank, "pid": os.getpid(), "weights": weights, "global_step": state.global_step}
        (self.out / f"rank-{rank}.json").write_text(json.dumps(facts))
        deadline = time.monotonic() + 120
        while not (self.out / "stop").exists() and time.monotonic() < deadline:
            time.sleep(0.05)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    model = BertForSequenceClassification(cfg)
    training = TrainingArguments(
        output_dir=str(args.out / "trainer"),
        per_device_train_batch_size=4,
        max_steps=4,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=training,
        train_dataset=Batches(),
        callbacks=[Linger(args.out), AnatomyCallback(interval_s=0.05)],
    )
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
