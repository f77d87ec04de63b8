"""The technique table, the best combination and the largest batch (anatomy.plan.search)."""

from __future__ import annotations

from dataclasses import replace

from anatomy import techniques
from anatomy.plan import Planner, PlanSettings, largest_batch, technique_table
from anatomy.plan.search import SpeedSource, single_techniques
from anatomy.techniques import CHECKPOINTING, GRAD_ACCUM, TECHNIQUES
from anatomy.vocabulary import Component, Precision


def test_technique_rows_and_best_combination(tiny_configs: dict) -> None:
    planner = Planner(tiny_configs["bert"], "sequence-classification")
    settings = PlanSettings(batch_size=8, seq_len=64)
    base = planner.plan(settings, gpu_bytes=1 << 40)
    # A GPU just too small for the baseline: something must be traded for memory.
    gpu = base.total_bytes - 1
    rows = technique_table(planner, settings, gpu_bytes=gpu)
    by_key = {row.keys: row for row in rows}
    assert rows[0].label == "baseline" and rows[0].fits is False
    accum = by_key[(GRAD_ACCUM,)]
    assert (accum.settings.batch_size, accum.settings.grad_accum) == (2, 4)
    assert accum.speed_factor == TECHNIQUES[GRAD_ACCUM].speed_factor == round(7.75 / 8.86, 3)
    ckpt = by_key[(CHECKPOINTING,)]
    assert (
        ckpt.result is not None
        and ckpt.result.components[Component.ACTIVATIONS] < (base.components[Component.ACTIVATIONS])
    )
    assert ckpt.speed_source == "guide, BERT-large on V100"
    best = rows[-1]
    assert best.is_best and best.label.startswith("best combination")
    assert best.fits is True
    # No fitting single technique or combination is faster by the guide's factors.
    assert all((row.speed_factor or 1.0) <= (best.speed_factor or 1.0) for row in rows[1:-1] if row.fits)


def test_every_row_says_where_its_speed_comes_from(tiny_configs: dict) -> None:
    planner = Planner(tiny_configs["llama"], "causal-lm")
    rows = technique_table(planner, PlanSettings(batch_size=4, seq_len=64), gpu_bytes=1 << 40)
    for row in rows:
        if not row.keys:
            assert row.speed_source == SpeedSource.BASELINE
        elif row.speed_factor is None:
            assert row.speed_source == SpeedSource.NONE  # 8-bit AdamW, Adafactor: the guide gives none
        elif len([k for k in row.keys if TECHNIQUES[k].speed_factor is not None]) == 1:
            assert row.speed_source == techniques.GUIDE_SOURCE
        else:
            assert row.speed_source == SpeedSource.PRODUCT


def test_no_checkpointing_row_for_a_model_without_it() -> None:
    from transformers import ConvNextConfig

    planner = Planner(ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], image_size=32))
    assert not planner.supports_checkpointing
    rows = technique_table(planner, PlanSettings(batch_size=4), gpu_bytes=1 << 40)
    assert all(CHECKPOINTING not in row.keys for row in rows)
    singles = single_techniques(PlanSettings(batch_size=4), planner.supports_checkpointing)
    assert [key for key, _ in singles] == [GRAD_ACCUM, "mixed_precision", "adamw_8bit", "adafactor"]


def test_largest_batch_is_verified_and_maximal(tiny_configs: dict) -> None:
    planner = Planner(tiny_configs["gpt2"], "causal-lm")
    settings = PlanSettings(batch_size=1, seq_len=64, precision=Precision.BF16_MIXED)
    at_16 = planner.plan(replace(settings, batch_size=16), gpu_bytes=1 << 40)
    gpu = at_16.total_bytes + 1000
    search = largest_batch(planner, settings, gpu_bytes=gpu)
    assert search.batch_size is not None and search.result is not None
    assert search.result.fits
    assert planner.plan(replace(settings, batch_size=search.batch_size), gpu_bytes=gpu).fits
    assert not planner.plan(replace(settings, batch_size=search.batch_size + 1), gpu_bytes=gpu).fits
    assert search.batch_size >= 16


def test_largest_batch_of_a_vision_model() -> None:
    from transformers import ViTConfig

    # Tensors far above the CUDA allocator's 512-byte blocks, so the step is linear in the batch.
    planner = Planner(
        ViTConfig(
            hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256, image_size=64
        )
    )
    settings = PlanSettings(batch_size=1)
    gpu = planner.plan(replace(settings, batch_size=40), gpu_bytes=1 << 40).total_bytes + 1000
    search = largest_batch(planner, settings, gpu_bytes=gpu)
    assert search.batch_size is not None and search.batch_size >= 40
    assert not planner.plan(replace(settings, batch_size=search.batch_size + 1), gpu_bytes=gpu).fits


def test_nothing_fits_on_a_tiny_gpu(tiny_configs: dict) -> None:
    planner = Planner(tiny_configs["bert"], "sequence-classification")
    search = largest_batch(planner, PlanSettings(batch_size=4, seq_len=64), gpu_bytes=1 << 20)
    assert search.batch_size is None


def test_best_combination_is_the_baseline_when_it_fits(tiny_configs: dict) -> None:
    planner = Planner(tiny_configs["bert"], "sequence-classification")
    rows = technique_table(
        planner, PlanSettings(batch_size=2, seq_len=32, precision=Precision.BF16_MIXED), "H100"
    )
    best = rows[-1]
    assert best.keys == () and best.label == "best combination: baseline as is"
    assert best.speed_factor == 1.0 and best.fits is True
