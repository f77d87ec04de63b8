"""The planner (anatomy.plan.planner): fitting a GPU, checks before any fake step, big models."""

from __future__ import annotations

from typing import Any

import pytest

from anatomy.plan import PlanError, Planner, PlanSettings
from anatomy.vocabulary import Component, Precision


def test_fit_against_named_gpu(tiny_configs: dict) -> None:
    result = Planner(tiny_configs["bert"], "sequence-classification").plan(
        PlanSettings(batch_size=2, seq_len=32), gpu="H100-80GB"
    )
    assert result.gpu_name == "H100-80GB" and result.gpu_source == "--gpu"
    assert result.fits is True
    assert result.spare_bytes == result.gpu_bytes - result.total_bytes
    c = result.components
    assert result.total_bytes == result.peak_bytes + c[Component.CUDA_CONTEXT] + c[Component.ALLOCATOR_CACHE]
    assert sum(result.at_peak.values()) == result.peak_bytes


def _no_fake_step(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fail the test if a fake step runs: every check must come before it."""
    import anatomy.plan.planner as planner_module

    calls: list[int] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise AssertionError("the fake step ran before the input was checked")

    monkeypatch.setattr(planner_module, "run_step_profile", refuse)
    return calls


@pytest.mark.parametrize(
    ("settings", "gpu", "gpu_bytes", "message"),
    [
        (PlanSettings(seq_len=4096), None, None, "position embeddings"),
        (PlanSettings(batch_size=1, seq_len=16), "Z80", None, "unknown GPU"),
        (PlanSettings(batch_size=1, seq_len=16, target="cpu"), "Z80", None, "unknown GPU"),
        (
            PlanSettings(batch_size=1, seq_len=16, target="cpu"),
            "H100",
            None,
            "does not apply to --target cpu",
        ),
        (PlanSettings(batch_size=1, seq_len=16), "0GiB", None, "at least 1 MiB"),
        (PlanSettings(batch_size=1, seq_len=16), None, 0, "at least 1 MiB"),
        (PlanSettings(batch_size=10**12), None, None, "more than a plan can model"),
        (PlanSettings(batch_size=10**20), None, None, "more than a plan can model"),
        (PlanSettings(batch_size=1, seq_len=1 << 23), None, None, "more than a plan can model"),
        (PlanSettings(optimizer="lion"), None, None, "optimizer"),
        (PlanSettings(target_len=8), None, None, "--target-len applies to seq2seq-lm"),
        (PlanSettings(image_size=224), None, None, "--image-size applies to image-classification"),
    ],
)
def test_bad_input_is_refused_before_the_fake_step(
    settings: PlanSettings,
    gpu: str | None,
    gpu_bytes: int | None,
    message: str,
    tiny_configs: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _no_fake_step(monkeypatch)
    planner = Planner(tiny_configs["bert"], "sequence-classification")
    with pytest.raises(PlanError, match=message) as info:
        planner.plan(settings, gpu=gpu, gpu_bytes=gpu_bytes)
    assert "\n" not in str(info.value)
    assert calls == []


def test_unknown_task_is_a_plan_error(tiny_configs: dict) -> None:
    with pytest.raises(PlanError, match="task"):
        Planner(tiny_configs["bert"], "translation")
    with pytest.raises(PlanError, match="no image-classification head"):
        Planner(tiny_configs["bert"], "image-classification")


def test_rope_model_beyond_its_positions_is_a_warning(tiny_configs: dict) -> None:
    """Llama's rotary positions run at any length: planned, with a warning (BERT's learned positions
    cannot: an error, above)."""
    planner = Planner(tiny_configs["llama"], "causal-lm")  # max_position_embeddings 128
    result = planner.plan(PlanSettings(batch_size=1, seq_len=256, target="cpu"))
    assert len(result.warnings) == 1 and "max_position_embeddings (128)" in result.warnings[0]
    assert not planner.plan(PlanSettings(batch_size=1, seq_len=128, target="cpu")).warnings


def test_encoder_decoder_and_vision_are_planned() -> None:
    from transformers import T5Config, ViTConfig

    t5 = Planner(T5Config(d_model=32, num_layers=1, num_heads=2, d_kv=16, d_ff=64, vocab_size=300), name="t5")
    result = t5.plan(PlanSettings(batch_size=2, seq_len=32, target_len=8))
    assert result.task.value == "seq2seq-lm" and result.workload.target_len == 8
    assert result.components[Component.ACTIVATIONS]
    vit = Planner(ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    result = vit.plan(PlanSettings(batch_size=2))
    assert result.workload.image_size == 224 and result.workload.seq_len is None


@pytest.mark.slow
def test_llama_7b_parameter_count_and_states() -> None:
    from transformers import LlamaConfig

    h, inter, layers, vocab = 4096, 11008, 32, 32000
    cfg = LlamaConfig(
        hidden_size=h,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=vocab,
    )
    result = Planner(cfg, "causal-lm").plan(
        PlanSettings(batch_size=1, seq_len=2048, precision=Precision.BF16_MIXED)
    )
    params = 2 * vocab * h + layers * (4 * h * h + 3 * h * inter + 2 * h) + h
    assert result.parameter_count == params == 6_738_415_616
    assert result.components[Component.OPTIMIZER_STATES] >= 8 * params
    assert "extrapolated" in " ".join(result.notes)
    # The KV cache the loop keeps, 32 layers x 2048 tokens x 4096: under autocast the values are bf16
    # (a linear's output) and the keys fp32 (rotary positions multiply them by fp32 cos/sin).
    assert result.kv_cache_bytes == layers * 2048 * h * (4 + 2)
    assert result.workload.padded and result.settings.padded is None


def test_gpu_from_nvml_when_no_gpu_is_named() -> None:
    """No --gpu: the first GPU NVML reports (here the project's simulated NVML: an 8 x H100 box)."""
    import pynvml

    from anatomy.plan import nvml_gpu, resolve_gpu
    from tui.simnvml import Scenario, install, uninstall

    nvml_gpu.cache_clear()
    install(Scenario.demo_box(n_gpus=2))
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        expected = (pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        pynvml.nvmlShutdown()
        gpu = resolve_gpu(None)
    finally:
        uninstall()
        nvml_gpu.cache_clear()
    assert (gpu.name, gpu.total_bytes, gpu.source) == (*expected, "NVML")
    assert "H100" in gpu.name
    # Without NVML: the guide's V100, said so.
    assert resolve_gpu(None).source.startswith("default")
