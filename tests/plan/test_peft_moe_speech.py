"""LoRA, QLoRA, mixture-of-experts and speech plans against real CPU training steps (issue 17, 1-2).

The real runs are built the way users build them, with nothing from the planner: PEFT's
``get_peft_model(model, LoraConfig(r=8))`` (PEFT picks its default target modules), a 4-bit base
loaded by transformers from a saved checkpoint with a ``BitsAndBytesConfig`` (bitsandbytes quantizes
on CPU), Mixtral and Qwen2-MoE from their configs (transformers' grouped-matmul experts), Whisper
fed log-mel features. The oracle is the accuracy tests' (conftest.measure_real_step): weights are
parameters, buffers and bitsandbytes' quantization states; gradients and optimizer states the
tensors that exist; activations what saved_tensors_hooks sees; the peak glibc's heap.

Bounds: weights, gradients and optimizer states exact; activations within 1%; the peak within 5%.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import pytest
import torch

from anatomy.plan import Planner, PlanResult, PlanSettings
from anatomy.plan.quant import QuantSpec, weight_tensor_bytes
from anatomy.vocabulary import Component, Precision

ACTIVATIONS_REL = 0.01
PEAK_REL = 0.05


def _check(result: PlanResult, measured: Any, peak_rel: float = PEAK_REL) -> None:
    c = result.components
    assert c[Component.WEIGHTS] == measured.weights
    assert c[Component.GRADIENTS] == measured.gradients
    assert c[Component.OPTIMIZER_STATES] == measured.optimizer_states
    assert measured.activations > 0
    assert c[Component.ACTIVATIONS] == pytest.approx(measured.activations, rel=ACTIVATIONS_REL)
    assert result.peak_bytes == pytest.approx(measured.peak, rel=peak_rel)


@pytest.fixture(scope="module")
def configs() -> dict[str, Any]:
    from transformers import GPT2Config, LlamaConfig, T5Config

    return {
        "llama": LlamaConfig(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
        ),
        "gpt2": GPT2Config(vocab_size=1000, n_embd=96, n_layer=2, n_head=2, n_positions=128),
        "t5": T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_heads=4),
    }


TASKS = {"llama": "causal-lm", "gpt2": "causal-lm", "t5": "seq2seq-lm"}


def _auto(task: str) -> Any:
    import transformers

    return transformers.AutoModelForSeq2SeqLM if task == "seq2seq-lm" else transformers.AutoModelForCausalLM


def _real_builder(task: str, quant: str | None, lora: bool = True) -> Callable[[Any], torch.nn.Module]:
    """The model a user's script trains: loaded quantized by transformers, wrapped by PEFT."""

    def build(cfg: Any) -> torch.nn.Module:
        from peft import LoraConfig, get_peft_model
        from transformers import BitsAndBytesConfig

        auto = _auto(task)
        if quant is None:
            model = auto.from_config(cfg)
        else:
            qconfig = (
                BitsAndBytesConfig(load_in_8bit=True)
                if quant == "int8"
                else BitsAndBytesConfig(
                    load_in_4bit=True,
                    bnb_4bit_quant_type=quant,
                    bnb_4bit_use_double_quant=True,
                    bnb_4bit_compute_dtype=torch.bfloat16,
                )
            )
            with tempfile.TemporaryDirectory() as tmp:
                auto.from_config(cfg).save_pretrained(tmp)
                model = auto.from_pretrained(tmp, quantization_config=qconfig, device_map="cpu")
        return get_peft_model(model, LoraConfig(r=8)) if lora else model

    return build


def _settings(family: str, **options: Any) -> PlanSettings:
    extra = {"target_len": 32} if TASKS[family] == "seq2seq-lm" else {}
    return PlanSettings(batch_size=4, seq_len=64, target="cpu", **extra, **options)


@pytest.mark.parametrize("family", ["llama", "gpt2", "t5"])
def test_lora_plan_matches_real_peft_step(family: str, configs: dict[str, Any], real_step: Any) -> None:
    settings = _settings(family, lora_rank=8)
    result = Planner(configs[family], TASKS[family]).plan(settings)
    measured = real_step(
        configs[family], TASKS[family], settings, steps=2, build=_real_builder(TASKS[family], None)
    )
    _check(result, measured)
    # Only the adapters train: far fewer trainable parameters than the model has.
    assert 0 < result.trainable_parameters < result.parameter_count / 10


@pytest.mark.parametrize("family", ["llama", "gpt2", "t5"])
def test_qlora_plan_matches_real_bitsandbytes_step(
    family: str, configs: dict[str, Any], real_step: Any
) -> None:
    settings = _settings(family, lora_rank=8, quant="nf4")
    result = Planner(configs[family], TASKS[family]).plan(settings)
    measured = real_step(
        configs[family], TASKS[family], settings, steps=2, build=_real_builder(TASKS[family], "nf4")
    )
    _check(result, measured)


def test_lora_dropout_saves_the_dropped_input(configs: dict[str, Any], real_step: Any) -> None:
    """With lora_dropout > 0 each adapted layer saves its dropped input (and the mask): more
    activations than without, by the plan as by the real run."""
    from peft import LoraConfig, get_peft_model

    planner = Planner(configs["llama"], "causal-lm")
    settings = _settings("llama", lora_rank=8, lora_dropout=0.1)
    result = planner.plan(settings)
    measured = real_step(
        configs["llama"],
        "causal-lm",
        settings,
        steps=2,
        build=lambda cfg: get_peft_model(
            _auto("causal-lm").from_config(cfg), LoraConfig(r=8, lora_dropout=0.1)
        ),
    )
    _check(result, measured)
    plain = planner.plan(_settings("llama", lora_rank=8))
    assert result.components[Component.ACTIVATIONS] > plain.components[Component.ACTIVATIONS]


@pytest.mark.parametrize("quant", ["nf4", "fp4"])
def test_quantized_base_alone(quant: str, configs: dict[str, Any], real_step: Any) -> None:
    """--quant nf4 / fp4 without LoRA: the 4-bit layers frozen, every other module (embeddings, norms,
    the head) trained, as a model loaded with a BitsAndBytesConfig trains."""
    settings = _settings("llama", quant=quant)
    result = Planner(configs["llama"], "causal-lm").plan(settings)
    build = _real_builder("causal-lm", quant, lora=False)
    measured = real_step(configs["llama"], "causal-lm", settings, steps=2, build=build)
    _check(result, measured)


def test_lora_with_checkpointing(configs: dict[str, Any], real_step: Any) -> None:
    """LoRA with per-layer checkpointing (transformers' own, on the PEFT-wrapped model)."""
    settings = _settings("llama", lora_rank=8, gradient_checkpointing=True)
    result = Planner(configs["llama"], "causal-lm").plan(settings)
    measured = real_step(
        configs["llama"], "causal-lm", settings, steps=2, build=_real_builder("causal-lm", None)
    )
    _check(result, measured)


def test_int8_base_with_lora(configs: dict[str, Any], real_step: Any) -> None:
    """LLM.int8() base: states and activations exact; the peak is looser. bitsandbytes' CPU int8
    matmul keeps each layer's input on its autograd context (``ctx.A``, not saved for backward), so
    the loop's `out` keeps them alive until the next forward replaces it; the plan counts them
    there, while the heap oracle, which counts what `out` holds by its tensors, sees them only as
    heap in use before the step (about +10% on this model)."""
    settings = _settings("llama", lora_rank=8, quant="int8")
    result = Planner(configs["llama"], "causal-lm").plan(settings)
    measured = real_step(
        configs["llama"], "causal-lm", settings, steps=2, build=_real_builder("causal-lm", "int8")
    )
    _check(result, measured, peak_rel=0.15)


@pytest.mark.parametrize("shape", [(64, 64), (256, 64), (96, 288), (37, 53)])
@pytest.mark.parametrize("double_quant", [True, False])
def test_4bit_layout_matches_linear4bit(shape: tuple[int, int], double_quant: bool) -> None:
    """The layout computed from bitsandbytes' rules against what a real Linear4bit allocates on CPU:
    the packed weight and every tensor of its quantization state."""
    import bitsandbytes as bnb

    out, inp = shape
    layer = bnb.nn.Linear4bit(
        inp, out, bias=False, compute_dtype=torch.bfloat16, compress_statistics=double_quant, quant_type="nf4"
    )
    layer = layer.to("cpu")  # quantizes
    state = layer.weight.quant_state
    tensors = [layer.weight, state.absmax, state.code]
    if double_quant:
        tensors += [state.offset, state.state2.absmax, state.state2.code]
    real = sorted(t.untyped_storage().nbytes() for t in tensors)
    assert sorted(weight_tensor_bytes(out * inp, out, QuantSpec("nf4", double_quant))) == real


# ---------------------------------------------------------------------------------------------
# Mixture of experts


@pytest.fixture(scope="module")
def moe_configs() -> dict[str, Any]:
    from transformers import DeepseekV3Config, GptOssConfig, MixtralConfig, Qwen2MoeConfig

    common = {
        "vocab_size": 1000,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "num_experts_per_tok": 2,
    }
    return {
        "mixtral": MixtralConfig(intermediate_size=128, num_local_experts=4, **common),
        "qwen2_moe": Qwen2MoeConfig(
            intermediate_size=128,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=128,
            num_experts=4,
            **common,
        ),
        "gpt_oss": GptOssConfig(
            intermediate_size=64,
            head_dim=16,
            num_local_experts=4,
            sliding_window=32,
            layer_types=["sliding_attention", "full_attention"],
            **common,
        ),
        # DeepSeek-V3: multi-head latent attention (low-rank q and kv), a dense first layer, then
        # routed experts beside a shared one, group-limited routing with a score-correction bias.
        "deepseek_v3": DeepseekV3Config(
            intermediate_size=128,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_routed_experts=4,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            kv_lora_rank=16,
            q_lora_rank=32,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            **{**common, "num_key_value_heads": 4},
        ),
    }


@pytest.mark.parametrize(
    ("family", "precision"),
    [
        ("mixtral", Precision.FP32),
        ("mixtral", Precision.BF16_MIXED),
        ("qwen2_moe", Precision.FP32),
        ("gpt_oss", Precision.FP32),
        ("deepseek_v3", Precision.FP32),
        ("deepseek_v3", Precision.BF16_MIXED),
    ],
)
def test_moe_plan_matches_real_step(
    family: str, precision: Precision, moe_configs: dict[str, Any], real_step: Any
) -> None:
    config = moe_configs[family]
    settings = PlanSettings(batch_size=4, seq_len=64, target="cpu", precision=precision)
    result = Planner(config, "causal-lm").plan(settings)
    measured = real_step(config, "causal-lm", settings, steps=2)
    _check(result, measured)
    # Every expert's weights are counted: an independent count of the experts' parameters.
    experts = (
        getattr(config, "num_local_experts", None)
        or getattr(config, "n_routed_experts", None)
        or config.num_experts
    )
    inner = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    moe_layers = config.num_hidden_layers - (getattr(config, "first_k_dense_replace", None) or 0)
    expert_params = moe_layers * experts * 3 * config.hidden_size * inner
    assert result.parameter_count > expert_params
    assert any("expected and the worst case" in n for n in result.notes)


# ---------------------------------------------------------------------------------------------
# Speech


@pytest.fixture(scope="module")
def whisper_config() -> Any:
    from transformers import WhisperConfig

    return WhisperConfig(
        vocab_size=1000,
        num_mel_bins=16,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=64,
        max_target_positions=64,
        decoder_start_token_id=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )


@pytest.mark.parametrize("precision", [Precision.FP32, Precision.BF16_MIXED])
def test_whisper_plan_matches_real_step(precision: Precision, whisper_config: Any, real_step: Any) -> None:
    planner = Planner(whisper_config)
    assert planner.task.value == "speech-seq2seq"  # the default for a Whisper config
    settings = PlanSettings(batch_size=4, target_len=32, target="cpu", precision=precision)
    result = planner.plan(settings)
    # The model's window: the encoder's positions after its stride-2 convolution, 100 frames a second.
    assert result.workload.audio_frames == 2 * whisper_config.max_source_positions
    measured = real_step(whisper_config, "speech-seq2seq", settings, steps=2, padded=True)
    assert measured.inputs["input_features"] == (4, 16, 2 * whisper_config.max_source_positions)
    _check(result, measured)


def test_whisper_as_causal_lm_is_warned(whisper_config: Any) -> None:
    _, warnings = Planner(whisper_config, "causal-lm").workload(PlanSettings(seq_len=32))
    assert any("--task speech-seq2seq" in w for w in warnings)
    # Another length than the window: Whisper pads every clip to it, and says so.
    workload, warnings = Planner(whisper_config).workload(PlanSettings(audio_seconds=0.5))
    assert workload.audio_frames == 2 * whisper_config.max_source_positions
    assert any("pads every clip" in w for w in warnings)


def test_gemma2_still_plans(real_step: Any) -> None:
    """Gemma2 (alternating sliding-window and global attention, soft-capped logits) keeps working."""
    from transformers import Gemma2Config

    config = Gemma2Config(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        sliding_window=32,
    )
    settings = PlanSettings(batch_size=4, seq_len=64, target="cpu")
    result = Planner(config, "causal-lm").plan(settings)
    _check(result, real_step(config, "causal-lm", settings, steps=2))
