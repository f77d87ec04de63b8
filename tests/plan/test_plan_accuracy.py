"""The plan (fake tensors, CPU target) against real CPU training steps of the same tiny models.

Weights, gradients and optimizer states must be exact; activations within 5% of what the real
forward saves for backward; the peak within 10% of the real step's peak (glibc heap read after every
op, on top of the tensor bytes alive before the step) and in the same phase.
"""

from __future__ import annotations

from typing import Any

import pytest

from anatomy.plan import Planner, PlanResult, PlanSettings
from anatomy.vocabulary import Component, Precision

FP32, BF16 = Precision.FP32, Precision.BF16_MIXED

CASES: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "bert": (
        "sequence-classification",
        [
            {"precision": FP32, "optimizer": "adamw"},
            {"precision": BF16, "optimizer": "adamw"},
            {"precision": FP32, "optimizer": "sgd", "gradient_checkpointing": True},
        ],
    ),
    "gpt2": (
        "causal-lm",
        [
            {"precision": FP32, "optimizer": "sgd"},
            {"precision": BF16, "optimizer": "adafactor"},
            {"precision": FP32, "optimizer": "adamw", "grad_accum": 2},
        ],
    ),
    "llama": (
        "causal-lm",
        [
            {"precision": FP32, "optimizer": "adafactor"},
            {"precision": BF16, "optimizer": "sgd"},
            {"precision": FP32, "optimizer": "adamw", "gradient_checkpointing": True},
        ],
    ),
}


def _check(result: PlanResult, measured: Any) -> None:
    c = result.components
    assert c[Component.WEIGHTS] == measured.weights
    assert c[Component.GRADIENTS] == measured.gradients
    assert c[Component.OPTIMIZER_STATES] == measured.optimizer_states
    assert measured.activations > 0
    assert c[Component.ACTIVATIONS] == pytest.approx(measured.activations, rel=0.05)
    assert result.peak_bytes == pytest.approx(measured.peak, rel=0.10)
    assert result.peak_phase == measured.peak_phase
    # CPU target: no CUDA-only components, and they are unknown (None), not zero.
    assert c[Component.CUDA_CONTEXT] is None and c[Component.ALLOCATOR_CACHE] is None


def _run(family: str, index: int, tiny_configs: dict[str, Any], measure_real_step: Any) -> None:
    task, variants = CASES[family]
    settings = PlanSettings(batch_size=4, seq_len=64, target="cpu", **variants[index])
    config = tiny_configs[family]
    result = Planner(config, task).plan(settings)
    measured = measure_real_step(config, task, settings)
    _check(result, measured)


@pytest.mark.parametrize("index", range(3))
def test_bert_plan_matches_real_step(index: int, tiny_configs: dict[str, Any], real_step: Any) -> None:
    _run("bert", index, tiny_configs, real_step)


@pytest.mark.parametrize("index", range(3))
def test_gpt2_plan_matches_real_step(index: int, tiny_configs: dict[str, Any], real_step: Any) -> None:
    _run("gpt2", index, tiny_configs, real_step)


@pytest.mark.parametrize("index", range(3))
def test_llama_plan_matches_real_step(index: int, tiny_configs: dict[str, Any], real_step: Any) -> None:
    _run("llama", index, tiny_configs, real_step)


def test_mixed_precision_weights_include_low_precision_copies(tiny_configs: dict[str, Any]) -> None:
    """bf16 autocast keeps a 2-byte copy of every weight a matmul uses: the guide's ~6 bytes/param."""
    planner = Planner(tiny_configs["llama"], "causal-lm")
    fp32 = planner.plan(PlanSettings(batch_size=2, seq_len=32, target="cpu"))
    bf16 = planner.plan(PlanSettings(batch_size=2, seq_len=32, target="cpu", precision=BF16))
    states = planner.states
    # Independent: the matmul weights are every 2-D parameter except the input embedding (a lookup).
    embed = planner.config.vocab_size * planner.config.hidden_size
    matmul_params = sum(
        _numel(shape) for shape, _ in states.shapes if len(shape) == 2 and _numel(shape) != embed
    )
    matmul_params += embed  # the lm_head matmul (tied or not) casts a weight of the embedding's shape
    extra = bf16.components[Component.WEIGHTS] - fp32.components[Component.WEIGHTS]
    assert extra == 2 * matmul_params
    assert bf16.components[Component.ACTIVATIONS] < fp32.components[Component.ACTIVATIONS]


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def test_checkpointing_lowers_activations(tiny_configs: dict[str, Any]) -> None:
    planner = Planner(tiny_configs["bert"], "sequence-classification")
    base = PlanSettings(batch_size=4, seq_len=64, target="cpu")
    plain = planner.plan(base)
    ckpt = planner.plan(PlanSettings(batch_size=4, seq_len=64, target="cpu", gradient_checkpointing=True))
    hidden = planner.config.hidden_size
    # Each checkpointed layer keeps its fp32 input (B x S x H) plus what is outside the layers.
    layer_inputs = planner.config.num_hidden_layers * 4 * 64 * hidden * 4
    assert ckpt.components[Component.ACTIVATIONS] >= layer_inputs
    assert ckpt.components[Component.ACTIVATIONS] < plain.components[Component.ACTIVATIONS] / 2
