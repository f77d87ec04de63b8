"""Shared fixtures of the hook tests: small real transformers models (random weights, built from
configs) and a private runtime directory per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

SEQ = 64
BATCH = 4


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own ANATOMY_TOP_DIR; ANATOMY_TOP is unset unless a test sets it."""
    directory = tmp_path / "rt"
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(directory))
    monkeypatch.delenv("ANATOMY_TOP", raising=False)
    yield directory


def small_bert(layers: int = 2, hidden: int = 128, vocab: int = 30522, seed: int = 0) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=4 * hidden,
        max_position_embeddings=128,
        attn_implementation="eager",
    )
    return BertForSequenceClassification(cfg)


def small_gpt2(seed: int = 0) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=5000, n_positions=128, n_embd=64, n_layer=2, n_head=2)
    return GPT2LMHeadModel(cfg)


def bert_batch(seed: int = 1, batch: int = BATCH, seq: int = SEQ) -> dict[str, torch.Tensor]:
    """The guide's example shape: random token ids 100..30000 and binary labels."""
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": torch.randint(100, 30000, (batch, seq), generator=g),
        "labels": torch.randint(0, 2, (batch,), generator=g),
    }


def train_steps(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: int,
    tracker: object | None = None,
    batch: dict[str, torch.Tensor] | None = None,
    accum: int = 1,
    autocast: torch.dtype | None = None,
) -> list[float]:
    """A plain training loop; with a tracker, each optimizer step runs inside ``tracker.step()``."""
    import contextlib

    batch = batch if batch is not None else bert_batch()
    losses: list[float] = []
    for _ in range(steps):
        ctx = tracker.step() if tracker is not None else contextlib.nullcontext()  # type: ignore[attr-defined]
        with ctx:
            for _ in range(accum):
                off = contextlib.nullcontext()
                with torch.autocast("cpu", dtype=autocast) if autocast is not None else off:
                    loss = model(**batch).loss
                (loss / accum).backward()
                losses.append(float(loss.detach()))
            optimizer.step()
            optimizer.zero_grad()
    return losses


@pytest.fixture
def hk() -> SimpleNamespace:
    """The helpers above (importlib import mode cannot import conftest from a test module)."""
    return SimpleNamespace(
        small_bert=small_bert,
        small_gpt2=small_gpt2,
        bert_batch=bert_batch,
        train_steps=train_steps,
        SEQ=SEQ,
        BATCH=BATCH,
    )
