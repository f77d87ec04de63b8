"""Settings resolved against a model (anatomy.plan.workload) and the batch it is fed (plan.model)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from anatomy.plan import Planner, PlanSettings
from anatomy.plan.model import make_inputs, padded_lengths
from anatomy.plan.settings import PlanError, Task
from anatomy.vocabulary import Component


def test_text_models_are_padded_by_default(tiny_configs: dict[str, Any]) -> None:
    planner = Planner(tiny_configs["llama"], "causal-lm")
    workload, warnings = planner.workload(PlanSettings(batch_size=2, seq_len=16))
    assert workload.padded and workload.use_cache and not warnings
    assert workload.describe() == "batch 2 x seq 16, padded"
    off = planner.workload(PlanSettings(batch_size=2, seq_len=16, padded=False, use_cache=False))[0]
    assert not off.padded and not off.use_cache


def test_a_padded_batch_has_padding_in_every_row(tiny_configs: dict[str, Any]) -> None:
    """What a collator builds: right padding with the pad token, mask zeros, labels -100 there."""
    planner = Planner(tiny_configs["llama"], "causal-lm")
    workload = planner.workload(PlanSettings(batch_size=4, seq_len=16))[0]
    inputs = make_inputs(planner.config, workload)
    mask, ids, labels = inputs["attention_mask"], inputs["input_ids"], inputs["labels"]
    lengths = padded_lengths(4, 16)
    assert lengths == [14, 12, 10, 8] and padded_lengths(1, 16) == [8]
    assert mask.sum(dim=1).tolist() == lengths
    pad = planner.config.pad_token_id or 0
    assert bool((ids[mask == 0] == pad).all()) and bool((labels[mask == 0] == -100).all())
    assert bool((labels[mask == 1] == ids[mask == 1]).all())


def test_seq2seq_workload(tiny_configs: dict[str, Any]) -> None:
    from transformers import T5Config

    planner = Planner(T5Config(d_model=32, num_layers=1, num_heads=2, d_kv=16, d_ff=64, vocab_size=300))
    assert planner.task is Task.SEQ2SEQ_LM
    assert planner.config.decoder_start_token_id == 0  # set for a config that names none
    workload = planner.workload(PlanSettings(batch_size=2, seq_len=32, target_len=8))[0]
    assert (workload.seq_len, workload.target_len) == (32, 8)
    inputs = make_inputs(planner.config, workload)
    assert inputs["labels"].shape == (2, 8) and inputs["input_ids"].shape == (2, 32)
    assert planner.workload(PlanSettings(batch_size=2, seq_len=32))[0].target_len == 32  # default


def test_vision_workload_and_another_resolution() -> None:
    from transformers import ViTConfig

    planner = Planner(
        ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    )
    native = planner.workload(PlanSettings(batch_size=2))[0]
    assert (native.image_size, native.channels, native.padded) == (224, 3, False)
    assert not native.interpolate_pos_encoding
    other, warnings = planner.workload(PlanSettings(batch_size=2, image_size=384))
    assert other.interpolate_pos_encoding and "interpolate_pos_encoding" in warnings[0]
    inputs = make_inputs(planner.config, other)
    assert inputs["pixel_values"].shape == (2, 3, 384, 384) and inputs["interpolate_pos_encoding"] is True
    # The plan runs at that resolution: more patches, more activations.
    small = planner.plan(PlanSettings(batch_size=2, target="cpu"))
    large = planner.plan(PlanSettings(batch_size=2, target="cpu", image_size=384))
    assert large.components[Component.ACTIVATIONS] > 2 * small.components[Component.ACTIVATIONS]


def test_learned_positions_refuse_long_targets() -> None:
    from transformers import BartConfig

    planner = Planner(
        BartConfig(
            vocab_size=300,
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
        ),
        "seq2seq-lm",
    )
    with pytest.raises(PlanError, match="target length 128 exceeds the model's 64 position embeddings"):
        planner.workload(PlanSettings(seq_len=32, target_len=128))


def test_padding_needs_an_attention_mask(tiny_configs: dict[str, Any]) -> None:
    planner = Planner(tiny_configs["llama"], "causal-lm")
    planner.forward_params = frozenset({"input_ids", "labels"})  # a model that takes no mask
    assert not planner.workload(PlanSettings())[0].padded
    with pytest.raises(PlanError, match="no-padding"):
        planner.workload(PlanSettings(padded=True))


def test_fake_batch_values_are_real(tiny_configs: dict[str, Any]) -> None:
    """Under the fake step's modes the integer inputs hold values (so transformers reads the
    padding), while float tensors stay fake."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # no public name in torch

    from anatomy.plan.values import RealIndices, is_fake

    planner = Planner(tiny_configs["llama"], "causal-lm")
    workload = planner.workload(PlanSettings(batch_size=2, seq_len=8))[0]
    with FakeTensorMode(allow_non_fake_inputs=True), RealIndices():
        inputs = make_inputs(planner.config, workload)
        hidden = torch.randn(2, 8, 1 << 21)  # 32M elements: too large to be real
    assert not is_fake(inputs["attention_mask"])
    assert inputs["attention_mask"].sum().item() == sum(padded_lengths(2, 8))
    assert is_fake(hidden)
