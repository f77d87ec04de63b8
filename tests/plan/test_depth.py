"""Deep models from shallow runs (anatomy.plan.depth): extrapolation equals the full-depth run."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from anatomy.plan import Planner, PlanSettings
from anatomy.vocabulary import Component


def _deep(config: Any, **depths: int) -> Any:
    cfg = copy.deepcopy(config)
    for attr, depth in depths.items():
        setattr(cfg, attr, depth)
    return cfg


def _same(fast: Any, full: Any) -> None:
    assert "extrapolated" in " ".join(fast.notes)
    assert not any("extrapolated" in n for n in full.notes)
    assert fast.components[Component.ACTIVATIONS] == pytest.approx(
        full.components[Component.ACTIVATIONS], rel=0.005
    )
    assert fast.peak_bytes == pytest.approx(full.peak_bytes, rel=0.005)
    assert fast.peak_phase == full.peak_phase
    assert fast.kv_cache_bytes == pytest.approx(full.kv_cache_bytes, rel=0.005)


@pytest.mark.parametrize(
    ("family", "task", "target"),
    [("bert", "sequence-classification", "cpu"), ("llama", "causal-lm", "cuda")],
)
def test_depth_extrapolation_equals_full_run(family: str, task: str, target: str, tiny_configs: dict) -> None:
    planner = Planner(_deep(tiny_configs[family], num_hidden_layers=8), task)
    settings = PlanSettings(batch_size=2, seq_len=32, target=target)
    fast = planner.plan(settings)
    full = planner.plan(replace(settings, exact_depth=True))
    _same(fast, full)
    assert "1-layer and 2-layer" in " ".join(fast.notes)


def test_encoder_decoder_extrapolates_each_stack() -> None:
    """T5 with 8 encoder and 7 decoder layers: three shallow runs (1/1, 2/1, 1/2) give the full model
    (whose first layer of each stack differs: it owns the relative position bias)."""
    from transformers import T5Config

    config = T5Config(
        vocab_size=500, d_model=32, d_kv=8, d_ff=64, num_layers=8, num_decoder_layers=7, num_heads=4
    )
    planner = Planner(config, "seq2seq-lm")
    settings = PlanSettings(batch_size=2, seq_len=32, target_len=16, target="cpu")
    fast = planner.plan(settings)
    full = planner.plan(replace(settings, exact_depth=True))
    _same(fast, full)
    assert "1/1, 2/1, 1/2 encoder/decoder layers" in " ".join(fast.notes)


def test_models_with_stages_run_in_full() -> None:
    """ConvNeXt's depth is a list of stages of different widths: never extrapolated."""
    from transformers import ConvNextConfig

    planner = Planner(ConvNextConfig(hidden_sizes=[8, 16, 32, 64], depths=[3, 3, 9, 3], image_size=64))
    result = planner.plan(PlanSettings(batch_size=2, target="cpu"))
    assert not any("extrapolated" in n for n in result.notes)
