"""The plan (fake tensors, CPU target) against real CPU training steps of the same tiny models.

Weights, gradients and optimizer states must be exact; activations within 5% of what the real
forward saves for backward; the peak within 10% of the real step's peak (glibc heap read after every
op, on top of the tensor bytes alive before the step) and in the same phase. The real heap also holds
autograd's own graph (C++ nodes, no tensors: ~2% of a tiny model's forward), which no tensor plan
sees; where the real forward and backward peaks are closer than that, either phase is accepted.

Beyond the families of the first plan (BERT, GPT-2, Llama, unpadded): the KV cache a causal LM
returns in train mode, padded batches, encoder-decoder (T5, BART) and vision (ViT, ConvNeXt) tasks.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from anatomy.plan import Planner, PlanResult, PlanSettings
from anatomy.vocabulary import Component, Phase, Precision

FP32, BF16 = Precision.FP32, Precision.BF16_MIXED
PHASE_TIE = 0.03

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


def _check(result: PlanResult, measured: Any, peak_rel: float = 0.10) -> None:
    c = result.components
    assert c[Component.WEIGHTS] == measured.weights
    assert c[Component.GRADIENTS] == measured.gradients
    assert c[Component.OPTIMIZER_STATES] == measured.optimizer_states
    assert measured.activations > 0
    assert c[Component.ACTIVATIONS] == pytest.approx(measured.activations, rel=0.05)
    assert result.peak_bytes == pytest.approx(measured.peak, rel=peak_rel)
    if result.peak_phase != measured.peak_phase:
        fwd, bwd = measured.phase_peaks[Phase.FORWARD], measured.phase_peaks[Phase.BACKWARD]
        assert abs(fwd - bwd) <= PHASE_TIE * measured.peak, (result.peak_phase, measured.peak_phase)
    assert result.kv_cache_bytes == measured.kv_cache
    # CPU target: no CUDA-only components, and they are unknown (None), not zero.
    assert c[Component.CUDA_CONTEXT] is None and c[Component.ALLOCATOR_CACHE] is None


def _run(family: str, index: int, tiny_configs: dict[str, Any], measure_real_step: Any) -> None:
    task, variants = CASES[family]
    # The first plan's figures were on unpadded batches; padding has its own tests below.
    settings = PlanSettings(batch_size=4, seq_len=64, target="cpu", padded=False, **variants[index])
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


# ---------------------------------------------------------------------------------------------
# The KV cache a causal LM returns in train mode


def _kv_cache_bytes(config: Any, batch: int, seq: int) -> int:
    """Independent count: keys and values of every layer, batch x kv heads x seq x head dim, fp32."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * batch * heads * seq * head_dim * 4


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_kv_cache_kept_by_the_loop(family: str, tiny_configs: dict[str, Any], real_step: Any) -> None:
    """A plain loop's `out` holds the cache through the optimizer step and the next forward: both
    phases carry it, in the plan as in the real run."""
    config = tiny_configs[family]
    settings = PlanSettings(batch_size=4, seq_len=64, target="cpu", padded=False)
    planner = Planner(config, "causal-lm")
    result = planner.plan(settings)
    measured = real_step(config, "causal-lm", settings)
    assert result.kv_cache_bytes == measured.kv_cache == _kv_cache_bytes(config, 4, 64)
    for phase in (Phase.FORWARD, Phase.OPTIMIZER):
        assert result.phase_peaks[phase] == pytest.approx(measured.phase_peaks[phase], rel=0.02), phase
    _check(result, measured)
    assert any("KV cache" in n and "--no-kv-cache" in n for n in result.notes)
    # Without the cache the optimizer step holds exactly the cache less (nothing else changes there).
    off = planner.plan(PlanSettings(batch_size=4, seq_len=64, target="cpu", padded=False, use_cache=False))
    assert off.kv_cache_bytes == 0 and not any("KV cache" in n for n in off.notes)
    assert result.phase_peaks[Phase.OPTIMIZER] - off.phase_peaks[Phase.OPTIMIZER] == result.kv_cache_bytes
    measured_off = real_step(config, "causal-lm", off.settings)
    assert measured_off.kv_cache == 0
    _check(off, measured_off)


def test_trainer_loop_frees_the_kv_cache(tiny_configs: dict[str, Any]) -> None:
    planner = Planner(tiny_configs["llama"], "causal-lm")
    plain = planner.plan(PlanSettings(batch_size=4, seq_len=64, target="cpu", padded=False))
    trainer = planner.plan(
        PlanSettings(batch_size=4, seq_len=64, target="cpu", padded=False, keep_outputs=False)
    )
    assert trainer.kv_cache_bytes == plain.kv_cache_bytes > 0  # the forward still returns it
    assert plain.phase_peaks[Phase.OPTIMIZER] - trainer.phase_peaks[Phase.OPTIMIZER] >= plain.kv_cache_bytes


# ---------------------------------------------------------------------------------------------
# Padded batches: the (B, 1, S, S) mask


@pytest.mark.parametrize(("batch", "seq"), [(8, 64), (4, 128), (2, 256)])
def test_padded_llama_at_512_tokens(
    batch: int, seq: int, tiny_configs: dict[str, Any], real_step: Any
) -> None:
    config = copy.deepcopy(tiny_configs["llama"])
    config.max_position_embeddings = 256
    planner = Planner(config, "causal-lm")
    padded = planner.plan(PlanSettings(batch_size=batch, seq_len=seq, target="cpu"))
    assert padded.workload.padded  # the default for a model whose forward takes an attention mask
    unpadded = planner.plan(PlanSettings(batch_size=batch, seq_len=seq, target="cpu", padded=False))
    real_padded = real_step(config, "causal-lm", padded.settings)
    real_unpadded = real_step(config, "causal-lm", unpadded.settings)
    _check(padded, real_padded)
    _check(unpadded, real_unpadded)
    # What the mask costs, by the plan and by the real runs: at least one (B, 1, S, S) bool mask.
    plan_extra = padded.components[Component.ACTIVATIONS] - unpadded.components[Component.ACTIVATIONS]
    real_extra = real_padded.activations - real_unpadded.activations
    assert real_extra >= batch * seq * seq
    assert plan_extra == pytest.approx(real_extra, rel=0.02)


# ---------------------------------------------------------------------------------------------
# Encoder-decoder and vision


@pytest.fixture(scope="module")
def family_configs() -> dict[str, Any]:
    from transformers import BartConfig, ConvNextConfig, T5Config, ViTConfig

    return {
        "t5": T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_heads=4),
        "bart": BartConfig(
            vocab_size=1000,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            max_position_embeddings=128,
        ),
        "vit": ViTConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=256,
            image_size=32,
            patch_size=8,
        ),
        "convnext": ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], image_size=64),
    }


@pytest.mark.parametrize(
    ("family", "options"),
    [
        ("t5", {"seq_len": 64, "target_len": 32}),
        ("t5", {"seq_len": 48, "target_len": 48, "padded": False, "precision": BF16}),
        ("bart", {"seq_len": 64, "target_len": 32, "optimizer": "sgd"}),
        ("vit", {}),
        ("vit", {"image_size": 48, "precision": BF16}),
        ("convnext", {"optimizer": "adafactor"}),
    ],
)
def test_other_families_match_real_steps(
    family: str, options: dict[str, Any], family_configs: dict[str, Any], real_step: Any
) -> None:
    config = family_configs[family]
    planner = Planner(config)  # the task from the config: seq2seq-lm or image-classification
    settings = PlanSettings(batch_size=4, target="cpu", **options)
    result = planner.plan(settings)
    measured = real_step(config, planner.task.value, settings)
    _check(result, measured)


def test_mixed_precision_weights_include_low_precision_copies(tiny_configs: dict[str, Any]) -> None:
    """bf16 autocast keeps a 2-byte copy of every weight a matmul uses: the guide's ~6 bytes/param."""
    planner = Planner(tiny_configs["llama"], "causal-lm")
    fp32 = planner.plan(PlanSettings(batch_size=2, seq_len=32, target="cpu"))
    bf16 = planner.plan(PlanSettings(batch_size=2, seq_len=32, target="cpu", precision=BF16))
    states = planner.states
    # Independent: the matmul weights are every 2-D parameter except the input embedding (a lookup).
    embed = planner.config.vocab_size * planner.config.hidden_size
    matmul_params = sum(s.numel for s in states.shapes if len(s.shape) == 2 and s.numel != embed)
    matmul_params += embed  # the lm_head matmul (tied or not) casts a weight of the embedding's shape
    extra = bf16.components[Component.WEIGHTS] - fp32.components[Component.WEIGHTS]
    assert extra == 2 * matmul_params
    assert bf16.components[Component.ACTIVATIONS] < fp32.components[Component.ACTIVATIONS]


def test_checkpointing_lowers_activations(tiny_configs: dict[str, Any]) -> None:
    planner = Planner(tiny_configs["bert"], "sequence-classification")
    plain = planner.plan(PlanSettings(batch_size=4, seq_len=64, target="cpu"))
    ckpt = planner.plan(PlanSettings(batch_size=4, seq_len=64, target="cpu", gradient_checkpointing=True))
    hidden = planner.config.hidden_size
    # Each checkpointed layer keeps its fp32 input (B x S x H) plus what is outside the layers.
    layer_inputs = planner.config.num_hidden_layers * 4 * 64 * hidden * 4
    assert ckpt.components[Component.ACTIVATIONS] >= layer_inputs
    assert ckpt.components[Component.ACTIVATIONS] < plain.components[Component.ACTIVATIONS] / 2
