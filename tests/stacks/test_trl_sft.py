"""TRL's ``SFTTrainer`` with its defaults (bf16 autocast, gradient checkpointing) and a LoRA adapter on a
tiny Llama built from a config, a word-level tokenizer built in memory and a small in-memory data set of
sentences of different lengths (padded batches). A subclass holds a frozen reference model, as DPO-style
trainers do (``ref_model``): the callback names it. Against the test's own counts; the training is
bit-identical with and without the hook.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import trl

import anatomy
from anatomy.vocabulary import Component, Precision
from tui.sources.reconcile import reconcile

pytestmark = pytest.mark.filterwarnings(
    "ignore::FutureWarning", "ignore::UserWarning", "ignore::DeprecationWarning"
)
WORDS = [f"w{i}" for i in range(200)]
STEPS = 3


def _tokenizer() -> object:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]"
    )


def _data() -> object:
    from datasets import Dataset

    g = torch.Generator().manual_seed(0)
    texts = []
    for i in range(24):
        n = 8 + (i * 7) % 40  # different lengths: every batch is padded
        texts.append(" ".join(WORDS[int(j)] for j in torch.randint(0, len(WORDS), (n,), generator=g)))
    return Dataset.from_dict({"text": texts})


class _WithReference(trl.SFTTrainer):  # type: ignore[misc]
    """A trainer that also holds a frozen reference model, as DPO's does."""

    def __init__(self, *args: object, ref_model: torch.nn.Module, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.ref_model = ref_model


def _run(st: SimpleNamespace, tmp: Path, ref: torch.nn.Module, hooked: bool) -> tuple[object, object]:
    from peft import LoraConfig

    callback = anatomy.AnatomyCallback(publish=False) if hooked else None
    config = trl.SFTConfig(
        output_dir=str(tmp),
        use_cpu=True,
        per_device_train_batch_size=4,
        max_steps=STEPS,
        max_length=64,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    assert config.bf16 and config.gradient_checkpointing  # TRL's defaults, kept
    trainer = _WithReference(
        model=st.tiny_llama(seed=0),
        args=config,
        train_dataset=_data(),
        processing_class=_tokenizer(),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
        callbacks=[callback] if callback is not None else None,
        ref_model=ref,
    )
    trainer.train()
    return trainer, callback


def test_sft_trainer_defaults_with_lora_and_a_reference_model(st: SimpleNamespace, tmp_path: Path) -> None:
    ref = st.tiny_llama(seed=3).eval().requires_grad_(False)
    plain, _ = _run(st, tmp_path / "plain", ref, hooked=False)
    trainer, callback = _run(st, tmp_path / "hooked", ref, hooked=True)
    assert st.logged_losses(trainer) == st.logged_losses(plain) and len(st.logged_losses(trainer)) == STEPS
    assert callback is not None and callback.tracker is not None
    tracker = callback.tracker
    hello, snap = tracker.hello, tracker.history[-1]

    model = trainer.model
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    ref_bytes = sum(t.numel() * t.element_size() for t in [*ref.parameters(), *ref.buffers()])
    assert hello.parameter_count == total and hello.trainable_parameter_count == trainable < total / 20
    assert hello.other_models == {"ref_model": ref_bytes}
    assert snap.memory[Component.OTHER_MODELS.value] == ref_bytes
    assert snap.memory[Component.OPTIMIZER_STATES.value] == st.optimizer_state_bytes(trainer.optimizer)

    # bf16 autocast over fp32 weights: mixed precision. The frozen base keeps no half-precision copy, so
    # the guide's weight figure is 4 B plus 2 B for the trained fraction only, not 6.
    assert hello.precision == Precision.BF16_MIXED.value
    expected_w = snap.expected_bytes_per_param[Component.WEIGHTS.value]
    assert expected_w == pytest.approx(4.0 + 2.0 * trainable / total, abs=1e-5)
    rows = {r.component: r for r in reconcile(hello, snap, None).rows}
    assert rows[Component.WEIGHTS].bytes_per_param == pytest.approx(expected_w, rel=0.02)
    assert rows[Component.OPTIMIZER_STATES].bytes_per_param == pytest.approx(8.0, rel=0.01)
    assert rows[Component.GRADIENTS].bytes_per_param == pytest.approx(4.0, rel=0.01)
