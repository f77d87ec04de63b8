"""The plan's error against real CPU training steps, on the cases issue 9 named: the KV cache a
causal LM returns in train mode, padded batches (Llama at batch x seq = 512), encoder-decoder
(T5, BART) and vision (ViT, ConvNeXt) models.

Each case is planned (``--target cpu``: what a CPU run measures) and trained for real on CPU by the
tests' independent oracle (tests/plan/conftest.py: storage sums, saved-tensor hooks, glibc's heap
after every op). Printed: plan / real - 1 for the activations, the step's peak and each phase's
peak, and the KV cache bytes of both. The real peaks include autograd's own graph (C++ nodes, no
tensors), which a tensor plan cannot see: about -1% to -3% on these tiny models.

Run: .venv/bin/python benchmarks/bench_plan_accuracy.py
"""

from __future__ import annotations

import importlib.util
import sys
import time
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


def _cases() -> list[tuple[str, Any, str | None, dict[str, Any]]]:
    from transformers import BartConfig, ConvNextConfig, GPT2Config, LlamaConfig, T5Config, ViTConfig

    llama = LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    gpt2 = GPT2Config(vocab_size=1000, n_embd=96, n_layer=2, n_head=2, n_positions=128)
    t5 = T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=256, num_layers=2, num_heads=4)
    bart = BartConfig(
        vocab_size=1000,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=128,
    )
    vit = ViTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        image_size=32,
        patch_size=8,
    )
    convnext = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], image_size=64)
    return [
        (
            "KV cache: Llama 4x64, unpadded",
            llama,
            "causal-lm",
            {"batch_size": 4, "seq_len": 64, "padded": False},
        ),
        (
            "KV cache: GPT-2 4x64, unpadded",
            gpt2,
            "causal-lm",
            {"batch_size": 4, "seq_len": 64, "padded": False},
        ),
        ("padded Llama 8x64", llama, "causal-lm", {"batch_size": 8, "seq_len": 64}),
        ("padded Llama 4x128", llama, "causal-lm", {"batch_size": 4, "seq_len": 128}),
        ("padded Llama 2x256", llama, "causal-lm", {"batch_size": 2, "seq_len": 256}),
        ("T5 4 x 64 -> 32, padded", t5, None, {"batch_size": 4, "seq_len": 64, "target_len": 32}),
        ("BART 4 x 64 -> 32, padded", bart, None, {"batch_size": 4, "seq_len": 64, "target_len": 32}),
        ("ViT 8 x 32px", vit, None, {"batch_size": 8}),
        ("ViT 8 x 48px, bf16", vit, None, {"batch_size": 8, "image_size": 48, "precision": "bf16"}),
        ("ConvNeXt 8 x 64px", convnext, None, {"batch_size": 8}),
    ]


def main() -> None:
    import transformers

    from anatomy.plan import Planner, PlanSettings
    from anatomy.vocabulary import Component, Phase, Precision

    transformers.logging.set_verbosity_error()
    oracle = _oracle()

    def err(plan: int, real: int) -> str:
        return f"{(plan - real) / real * 100:+5.1f}%"

    header = f"{'case':<32}{'acts':>7}{'peak':>7}{'fwd':>7}{'bwd':>7}{'opt':>7}"
    print(f"{header}  phase (plan/real)  KV cache plan/real")
    for name, config, task, options in _cases():
        if options.get("precision") == "bf16":
            options = {**options, "precision": Precision.BF16_MIXED}
        settings = PlanSettings(target="cpu", **options)
        planner = Planner(config, task)
        started = time.perf_counter()
        result = planner.plan(settings)
        plan_s = time.perf_counter() - started
        started = time.perf_counter()
        real = oracle.measure_real_step(config, planner.task.value, settings)
        real_s = time.perf_counter() - started
        acts = result.components[Component.ACTIVATIONS]
        assert acts is not None
        phases = " ".join(
            err(result.phase_peaks[p], real.phase_peaks[p]) for p in Phase if p in real.phase_peaks
        )
        print(
            f"{name:<32}{err(acts, real.activations):>7}{err(result.peak_bytes, real.peak):>7} {phases}  "
            f"{result.peak_phase.value[:3]}/{real.peak_phase.value[:3]}"
            f"{'':>10}{result.kv_cache_bytes}/{real.kv_cache}   "
            f"(plan {plan_s:.2f} s, 3 real steps {real_s:.2f} s)"
        )


if __name__ == "__main__":
    main()
