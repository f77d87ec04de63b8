"""Shared pieces of the stack tests: tiny models built from configs (nothing is downloaded), padded
batches, a private runtime directory per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own ANATOMY_TOP_DIR; ANATOMY_TOP is unset unless a test sets it."""
    directory = tmp_path / "rt"
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(directory))
    monkeypatch.delenv("ANATOMY_TOP", raising=False)
    yield directory


def tiny_llama_config(layers: int = 2, vocab: int = 256, hidden: int = 64) -> object:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        use_cache=False,
        pad_token_id=0,
    )


def tiny_llama(seed: int = 0, layers: int = 2, hidden: int = 64) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(layers=layers, hidden=hidden))


def padded_batch(batch: int = 4, seq: int = 64, vocab: int = 256, seed: int = 1) -> dict[str, torch.Tensor]:
    """Token ids with left padding of a different length in every row: the model builds a (B, 1, S, S)
    attention mask from it."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for row in range(batch):
        mask[row, : 3 + 5 * row] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A tiny in-memory causal-LM data set: random token ids, labels = ids."""

    def __init__(self, n: int = 32, seq: int = 32, vocab: int = 256, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer_args(tmp: Path, steps: int, **extra: object) -> object:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(tmp / "out"),
        per_device_train_batch_size=4,
        max_steps=steps,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
        **extra,
    )


def logged_losses(trainer: object) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]  # type: ignore[attr-defined]


def optimizer_state_bytes(optimizer: object) -> int:
    """The test's own count: numel * element_size of every tensor in the optimizer's state, each storage
    once."""
    seen: set[int] = set()
    total = 0
    for state in optimizer.state.values():  # type: ignore[attr-defined]
        for t in state.values():
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.numel() * t.element_size()
    return total


def forward_keeps(run: object) -> int:
    """Bytes allocated while ``run()`` (a forward returning its loss) runs and still allocated after it:
    what the forward keeps for backward, its loss included. Independent of saved-tensor hooks: torch's
    profiler records every allocation and free of the CPU allocator (``profile_memory``), and the sum of
    each op's own net memory is what the window allocated and did not free."""
    from torch.profiler import ProfilerActivity, profile

    assert callable(run)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = run()
    net = sum(e.self_cpu_memory_usage for e in prof.events())
    del loss
    return int(net)


@pytest.fixture
def st() -> SimpleNamespace:
    """The helpers above (importlib import mode cannot import conftest from a test module)."""
    return SimpleNamespace(
        tiny_llama=tiny_llama,
        tiny_llama_config=tiny_llama_config,
        padded_batch=padded_batch,
        forward_keeps=forward_keeps,
        Tokens=Tokens,
        trainer_args=trainer_args,
        logged_losses=logged_losses,
        optimizer_state_bytes=optimizer_state_bytes,
    )
