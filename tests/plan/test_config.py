"""Reading a config (anatomy.plan.config): its task, its layer stacks, its position limit."""

from __future__ import annotations

from typing import Any

import pytest

from anatomy.plan.config import DepthAxis, default_task, depth_axes, layer_period, position_limit, with_depths
from anatomy.plan.settings import Task


def _configs() -> dict[str, Any]:
    from transformers import (
        BartConfig,
        BertConfig,
        ConvNextConfig,
        GPT2Config,
        LlamaConfig,
        T5Config,
        ViTConfig,
    )

    return {
        "llama": LlamaConfig(num_hidden_layers=4),
        "gpt2": GPT2Config(n_layer=5),
        "bert": BertConfig(num_hidden_layers=3),
        "t5": T5Config(num_layers=6, num_decoder_layers=4),
        "bart": BartConfig(encoder_layers=3, decoder_layers=2),
        "vit": ViTConfig(num_hidden_layers=7),
        "convnext": ConvNextConfig(depths=[3, 3, 9, 3]),
    }


@pytest.mark.parametrize(
    ("name", "architectures", "task"),
    [
        ("llama", None, Task.CAUSAL_LM),
        ("gpt2", ["GPT2LMHeadModel"], Task.CAUSAL_LM),
        ("bert", None, Task.SEQUENCE_CLASSIFICATION),
        ("bert", ["BertForMaskedLM"], Task.MASKED_LM),
        ("t5", None, Task.SEQ2SEQ_LM),
        ("t5", ["T5ForConditionalGeneration"], Task.SEQ2SEQ_LM),
        ("bart", ["BartForConditionalGeneration"], Task.SEQ2SEQ_LM),
        ("vit", None, Task.IMAGE_CLASSIFICATION),
        ("convnext", ["ConvNextForImageClassification"], Task.IMAGE_CLASSIFICATION),
    ],
)
def test_default_task(name: str, architectures: list[str] | None, task: Task) -> None:
    config = _configs()[name]
    config.architectures = architectures
    assert default_task(config) is task


def test_depth_axes() -> None:
    c = _configs()
    assert depth_axes(c["llama"]) == (DepthAxis("num_hidden_layers", 4),)
    assert depth_axes(c["gpt2"]) == (DepthAxis("num_hidden_layers", 5),)  # n_layer, via attribute_map
    assert depth_axes(c["t5"]) == (DepthAxis("num_layers", 6), DepthAxis("num_decoder_layers", 4))
    assert depth_axes(c["bart"]) == (DepthAxis("encoder_layers", 3), DepthAxis("decoder_layers", 2))
    assert depth_axes(c["convnext"]) == ()  # stages: run in full
    shallow = with_depths(c["t5"], {"num_layers": 1, "num_decoder_layers": 2})
    assert (shallow.num_layers, shallow.num_decoder_layers) == (1, 2)
    assert c["t5"].num_layers == 6  # a copy


def test_layer_period_from_layer_types() -> None:
    class Cfg:
        layer_types = ["sliding", "sliding", "full"] * 4

    assert layer_period(Cfg()) == 3
    assert layer_period(object()) == 1


def test_position_limits() -> None:
    c = _configs()
    llama, bert, gpt2 = position_limit(c["llama"]), position_limit(c["bert"]), position_limit(c["gpt2"])
    assert llama is not None and not llama.hard  # rotary: a warning beyond it
    assert bert is not None and bert.hard and bert.max_positions == 512
    assert gpt2 is not None and gpt2.hard and gpt2.max_positions == 1024  # n_positions
    assert position_limit(c["t5"]) is None  # relative position buckets
