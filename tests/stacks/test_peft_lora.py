"""Hugging Face Trainer + PEFT LoRA: bytes per parameter per *trainable* parameter.

A LoRA adapter trains a few thousand parameters of a frozen base: gradients and optimizer states exist only
for those, so their bytes per parameter divide by the trainable count (AdamW: 8 B per trainable parameter,
as the guide says), weights by the total. Every figure is compared with the test's own count over the
model's parameters and the optimizer's state, and the training is bit-identical with and without the hook.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import anatomy
from anatomy.vocabulary import Component
from tui.sources.reconcile import reconcile

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
STEPS = 4


def _lora(st: SimpleNamespace) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    model = st.tiny_llama(seed=0)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))


def _train(st: SimpleNamespace, tmp: Path, hooked: bool) -> tuple[object, anatomy.AnatomyCallback | None]:
    from transformers import Trainer

    callback = anatomy.AnatomyCallback(publish=False) if hooked else None
    trainer = Trainer(
        model=_lora(st),
        args=st.trainer_args(tmp, STEPS),
        train_dataset=st.Tokens(),
        callbacks=[callback] if callback is not None else None,
    )
    trainer.train()
    return trainer, callback


def test_lora_bytes_per_parameter_divide_by_the_trainable_count(st: SimpleNamespace, tmp_path: Path) -> None:
    plain, _ = _train(st, tmp_path / "plain", hooked=False)
    trainer, callback = _train(st, tmp_path / "hooked", hooked=True)
    assert callback is not None and callback.tracker is not None
    assert st.logged_losses(trainer) == st.logged_losses(plain) and len(st.logged_losses(trainer)) == STEPS
    for (name, a), (_, b) in zip(
        trainer.model.named_parameters(), plain.model.named_parameters(), strict=True
    ):
        assert torch.equal(a, b), name  # bit-identical training

    model = trainer.model
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert 0 < trainable < total / 20  # a LoRA adapter: few trainable parameters
    tracker = callback.tracker
    hello, snap = tracker.hello, tracker.history[-1]
    assert hello.parameter_count == snap.parameter_count == total
    assert hello.trainable_parameter_count == snap.trainable_parameter_count == trainable
    assert hello.weight_quantization is None

    opt_bytes = st.optimizer_state_bytes(trainer.optimizer)
    assert snap.memory[Component.OPTIMIZER_STATES.value] == opt_bytes
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    assert snap.memory[Component.WEIGHTS.value] == weight_bytes

    rows = {r.component: r for r in reconcile(hello, snap, None).rows}
    opt_row, grad_row, w_row = (
        rows[Component.OPTIMIZER_STATES],
        rows[Component.GRADIENTS],
        rows[Component.WEIGHTS],
    )
    assert opt_row.bytes_per_param == pytest.approx(opt_bytes / trainable)
    assert w_row.bytes_per_param == pytest.approx(weight_bytes / total)
    # The guide's figures now agree with the measurement: AdamW 8 B and fp32 gradients 4 B per trained
    # parameter (plus AdamW's 4-byte step counter per tensor), fp32 weights 4 B per parameter.
    assert opt_row.expected_bytes_per_param == 8.0
    assert opt_row.bytes_per_param == pytest.approx(8.0, rel=0.01)
    grads = snap.memory[Component.GRADIENTS.value]
    assert grads == trainable * 4
    assert grad_row.bytes_per_param == pytest.approx(4.0) == grad_row.expected_bytes_per_param
    assert w_row.expected_bytes_per_param == 4.0
