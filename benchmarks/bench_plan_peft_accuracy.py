"""The plan's error against real CPU training steps on the cases issue 17 (sections 1-2) named:
LoRA and QLoRA on Llama, GPT-2 and T5, LoRA dropout, an int8 base, a 4-bit base alone (nf4, fp4),
mixture-of-experts models (Mixtral, Qwen2-MoE, gpt-oss, DeepSeek-V3) and Whisper (speech-seq2seq).

Each case is planned (``--target cpu``) and trained for real on CPU by the tests' oracle
(tests/plan/conftest.py); the real models are built as users build them: PEFT's ``get_peft_model``
with its default targets, a 4-bit or int8 base loaded by transformers with a ``BitsAndBytesConfig``.
Printed: a Markdown table of plan / real bytes and the error for weights, gradients, optimizer
states, activations and the step's peak.

Run: PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_plan_peft_accuracy.py
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _oracle() -> Any:
    path = Path(__file__).resolve().parent.parent / "tests" / "plan" / "conftest.py"
    spec = importlib.util.spec_from_file_location("plan_oracle", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["plan_oracle"] = module
    spec.loader.exec_module(module)
    return module


def _auto(task: str) -> Any:
    import transformers

    return transformers.AutoModelForSeq2SeqLM if task == "seq2seq-lm" else transformers.AutoModelForCausalLM


def _builder(task: str, quant: str | None, dropout: float = 0.0, lora: bool = True) -> Callable[[Any], Any]:
    def build(cfg: Any) -> Any:
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import BitsAndBytesConfig

        if quant is None:
            model = _auto(task).from_config(cfg)
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
                _auto(task).from_config(cfg).save_pretrained(tmp)
                model = _auto(task).from_pretrained(tmp, quantization_config=qconfig, device_map="cpu")
        return get_peft_model(model, LoraConfig(r=8, lora_dropout=dropout)) if lora else model

    return build


Case = tuple[str, Any, str, Any, Callable[[Any], Any] | None, dict[str, Any]]


def _cases() -> list[Case]:
    import transformers

    from anatomy.plan import PlanSettings
    from anatomy.vocabulary import Precision

    dense = {
        "llama": transformers.LlamaConfig(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
        ),
        "gpt2": transformers.GPT2Config(vocab_size=1000, n_embd=96, n_layer=2, n_head=2, n_positions=128),
        "t5": transformers.T5Config(
            vocab_size=1000, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_heads=4
        ),
    }
    tasks = {"llama": "causal-lm", "gpt2": "causal-lm", "t5": "seq2seq-lm"}
    common: dict[str, Any] = {
        "vocab_size": 1000,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "num_experts_per_tok": 2,
    }
    moe = {
        "mixtral": transformers.MixtralConfig(intermediate_size=128, num_local_experts=4, **common),
        "qwen2_moe": transformers.Qwen2MoeConfig(
            intermediate_size=128,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=128,
            num_experts=4,
            **common,
        ),
        "gpt_oss": transformers.GptOssConfig(
            intermediate_size=64,
            head_dim=16,
            num_local_experts=4,
            sliding_window=32,
            layer_types=["sliding_attention", "full_attention"],
            **common,
        ),
        "deepseek_v3": transformers.DeepseekV3Config(
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
    whisper = transformers.WhisperConfig(
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
    base: dict[str, Any] = {"batch_size": 4, "target": "cpu"}
    cases: list[Case] = []
    for name, cfg in dense.items():
        task = tasks[name]
        extra = {"target_len": 32} if task == "seq2seq-lm" else {}
        s = {**base, "seq_len": 64, "lora_rank": 8, **extra}
        cases.append((f"{name} --lora 8", cfg, task, PlanSettings(**s), _builder(task, None), {}))
        cases.append(
            (f"{name} --qlora", cfg, task, PlanSettings(**s, quant="nf4"), _builder(task, "nf4"), {})
        )
    llama = {**base, "seq_len": 64, "lora_rank": 8}
    cases.append(
        (
            "llama --lora 8 --lora-dropout 0.1",
            dense["llama"],
            "causal-lm",
            PlanSettings(**llama, lora_dropout=0.1),
            _builder("causal-lm", None, 0.1),
            {},
        )
    )
    cases.append(
        (
            "llama --lora 8 --quant int8",
            dense["llama"],
            "causal-lm",
            PlanSettings(**llama, quant="int8"),
            _builder("causal-lm", "int8"),
            {},
        )
    )
    for quant in ("nf4", "fp4"):
        alone = PlanSettings(**{**llama, "lora_rank": None}, quant=quant)
        builder = _builder("causal-lm", quant, lora=False)
        cases.append((f"llama --quant {quant}", dense["llama"], "causal-lm", alone, builder, {}))
    both = ("mixtral", "deepseek_v3")
    for name, cfg in moe.items():
        for precision in [Precision.FP32, Precision.BF16_MIXED] if name in both else [Precision.FP32]:
            settings = PlanSettings(**base, seq_len=64, precision=precision)
            cases.append((f"{name} {precision.value}", cfg, "causal-lm", settings, None, {}))
    for precision in (Precision.FP32, Precision.BF16_MIXED):
        settings = PlanSettings(**base, target_len=32, precision=precision)
        cases.append(
            (f"whisper {precision.value}", whisper, "speech-seq2seq", settings, None, {"padded": True})
        )
    return cases


def main() -> None:
    from anatomy.plan import Planner
    from anatomy.vocabulary import Component

    oracle = _oracle()
    print("| case | weights | gradients | optimizer states | activations | peak |")
    print("|---|---|---|---|---|---|")
    for name, cfg, task, settings, build, overrides in _cases():
        result = Planner(cfg, task).plan(settings)
        real = oracle.measure_real_step(cfg, task, settings, steps=2, build=build, **overrides)
        c = result.components
        pairs = [
            (c[Component.WEIGHTS], real.weights),
            (c[Component.GRADIENTS], real.gradients),
            (c[Component.OPTIMIZER_STATES], real.optimizer_states),
            (c[Component.ACTIVATIONS], real.activations),
            (result.peak_bytes, real.peak),
        ]
        cells = [f"{p:,} / {r:,} ({(p - r) / r * 100:+.2f}%)" for p, r in pairs]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
