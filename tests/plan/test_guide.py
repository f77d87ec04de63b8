"""The plan against the guide's own measurements: BERT-large, batch 4 x 512, HF Trainer on a
V100-16GB, nvidia-smi after training (CUDA context + everything the caching allocator reserved).

The guide ran transformers' unfused ("eager") attention and the Trainer's loop, so the plan is made
with ``fused_attention=False`` and the Trainer's loop (outputs dropped after the loss, an in-place
AdamW). One number of the plan, the allocator headroom (plan.ALLOCATOR_HEADROOM), was calibrated on
these four runs; the test checks that one headroom explains all four within 12% and that the
plan orders the techniques as the guide measured them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from anatomy.plan import Planner, PlanSettings
from anatomy.techniques import GUIDE_BASELINE_MEMORY_MB, TECHNIQUES
from anatomy.vocabulary import Precision

MIB = 1 << 20


@pytest.mark.slow
def test_guide_bert_large_runs() -> None:
    from transformers import BertConfig

    config = BertConfig(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    )
    planner = Planner(config, "sequence-classification", name="bert-large")
    # The guide's dummy dataset has no attention mask (token ids and labels only): unpadded.
    trainer = PlanSettings(
        batch_size=4,
        seq_len=512,
        fused_attention=False,
        keep_outputs=False,
        optimizer_impl="fused",
        padded=False,
    )
    runs = {
        "baseline": (trainer, GUIDE_BASELINE_MEMORY_MB),
        "accumulation": (
            replace(trainer, batch_size=1, grad_accum=4),
            TECHNIQUES["gradient_accumulation"].guide_memory_mb,
        ),
        "checkpointing": (
            replace(trainer, gradient_checkpointing=True),
            TECHNIQUES["gradient_checkpointing"].guide_memory_mb,
        ),
        "fp16": (
            replace(trainer, precision=Precision.FP16_MIXED),
            TECHNIQUES["mixed_precision"].guide_memory_mb,
        ),
    }
    predicted = {}
    for name, (settings, guide_mb) in runs.items():
        total = planner.plan(settings, gpu="V100-16GB").total_bytes / MIB
        predicted[name] = total
        assert total == pytest.approx(guide_mb, rel=0.12), name
    # The guide's order: checkpointing < accumulation < fp16 < baseline.
    assert predicted["checkpointing"] < predicted["accumulation"] < predicted["fp16"] < predicted["baseline"]
