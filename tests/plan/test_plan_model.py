"""The plan's models: depth extrapolation, CUDA kernels, optimizer states, techniques, batch search."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from anatomy.plan import (
    PlanError,
    Planner,
    PlanSettings,
    largest_batch,
    layer_period,
    optimizer_state_bytes,
    technique_table,
)
from anatomy.techniques import CHECKPOINTING, GRAD_ACCUM, TECHNIQUES
from anatomy.vocabulary import Component, Precision


def _deep(config: Any, layers: int) -> Any:
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = layers
    return cfg


@pytest.mark.parametrize(
    ("family", "task", "target"),
    [("bert", "sequence-classification", "cpu"), ("llama", "causal-lm", "cuda")],
)
def test_depth_extrapolation_equals_full_run(family: str, task: str, target: str, tiny_configs: dict) -> None:
    planner = Planner(_deep(tiny_configs[family], 8), task)
    settings = PlanSettings(batch_size=2, seq_len=32, target=target)
    fast = planner.plan(settings)
    full = planner.plan(replace(settings, exact_depth=True))
    assert "extrapolated" in " ".join(fast.notes)
    assert not any("extrapolated" in n for n in full.notes)
    assert fast.components[Component.ACTIVATIONS] == pytest.approx(
        full.components[Component.ACTIVATIONS], rel=0.005
    )
    assert fast.peak_bytes == pytest.approx(full.peak_bytes, rel=0.005)
    assert fast.peak_phase == full.peak_phase


def test_layer_period_from_layer_types() -> None:
    class Cfg:
        layer_types = ["sliding", "sliding", "full"] * 4

    assert layer_period(Cfg()) == 3
    assert layer_period(object()) == 1


def test_cuda_target_keeps_one_byte_dropout_masks(tiny_configs: dict) -> None:
    """CPU dropout saves a float noise tensor, CUDA's native_dropout a bool mask: 3 bytes less per
    dropped element. BERT (eager attention, so both targets run the same attention code) drops the
    embeddings, each layer's attention probabilities (B x heads x S x S), attention and FFN outputs
    (B x S x H each) and the pooled output (B x H)."""
    cfg = copy.deepcopy(tiny_configs["bert"])
    cfg._attn_implementation = "eager"
    planner = Planner(cfg, "sequence-classification")
    b, s, h, heads, layers = 2, 32, cfg.hidden_size, cfg.num_attention_heads, cfg.num_hidden_layers
    cpu = planner.plan(PlanSettings(batch_size=b, seq_len=s, target="cpu"))
    cuda = planner.plan(PlanSettings(batch_size=b, seq_len=s, target="cuda"))
    dropped = (1 + 2 * layers) * b * s * h + layers * b * heads * s * s + b * h
    diff = cpu.components[Component.ACTIVATIONS] - cuda.components[Component.ACTIVATIONS]
    # The CUDA target also rounds every saved storage up to 512 bytes: allow that much per tensor.
    assert abs(diff - 3 * dropped) <= 512 * 40


def test_fused_attention_does_not_keep_probabilities(tiny_configs: dict) -> None:
    """Unfused attention keeps, per element of the B x heads x S x S probabilities, the fp32 softmax
    output (4 bytes), the dropout mask (1) and the dropped fp32 probabilities (4): a term quadratic in
    the sequence length. Fused attention keeps O(S) per row: activations are linear in S."""
    cfg = copy.deepcopy(tiny_configs["gpt2"])
    cfg.n_positions = 256
    planner = Planner(cfg, "causal-lm")
    b, heads, layers = 2, cfg.n_head, cfg.n_layer

    def acts(seq: int, fused: bool) -> int:
        settings = PlanSettings(batch_size=b, seq_len=seq, fused_attention=fused)
        value = planner.plan(settings).components[Component.ACTIVATIONS]
        assert value is not None
        return value

    for fused in (True, False):
        # a(S) = alpha S + beta S^2  =>  a(256) - 2 a(128) = beta (256^2 - 2 * 128^2) = 2 beta 128^2
        quadratic = (acts(256, fused) - 2 * acts(128, fused)) / 2
        per_prob = quadratic / (layers * b * heads * 128 * 128)
        if fused:
            assert abs(per_prob) < 0.01
        else:
            assert 9.0 <= per_prob < 9.5


def _real_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    seen: dict[int, int] = {}
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                seen[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("name", ["adamw", "sgd", "adafactor", "adafactor-torch"])
def test_optimizer_state_bytes_match_real_optimizers(name: str) -> None:
    from transformers.optimization import Adafactor

    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.LayerNorm(40), torch.nn.Linear(40, 3))
    opt: torch.optim.Optimizer = {
        "adamw": lambda ps: torch.optim.AdamW(ps),
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        "adafactor": lambda ps: Adafactor(ps, lr=1e-3, relative_step=False, scale_parameter=False),
        "adafactor-torch": lambda ps: torch.optim.Adafactor(ps),
    }[name](model.parameters())
    model(torch.randn(5, 24)).sum().backward()
    opt.step()
    shapes = tuple((tuple(p.shape), p.element_size()) for p in model.parameters())
    assert optimizer_state_bytes(name, shapes, "cpu") == _real_state_bytes(opt)


def test_eight_bit_adamw_is_about_two_bytes_per_param() -> None:
    shapes = (((4096, 1024), 4), ((1024,), 4))
    params = 4096 * 1024 + 1024
    state = optimizer_state_bytes("adamw-8bit", shapes, "cpu")
    # Two uint8 states + one fp32 absmax per 256 values each; the small vector keeps fp32 states.
    expected = 2 * 4096 * 1024 + 2 * 4 * math.ceil(4096 * 1024 / 256) + 2 * 4 * 1024 + 2 * 256 * 4
    assert state == expected
    assert 2.0 <= state / params < 2.1


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
    assert best.label.startswith("best combination")
    assert best.fits is True
    # No fitting single technique or combination is faster by the guide's factors.
    assert all((row.speed_factor or 1.0) <= (best.speed_factor or 1.0) for row in rows[1:-1] if row.fits)


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


def test_nothing_fits_on_a_tiny_gpu(tiny_configs: dict) -> None:
    planner = Planner(tiny_configs["bert"], "sequence-classification")
    search = largest_batch(planner, PlanSettings(batch_size=4, seq_len=64), gpu_bytes=1 << 20)
    assert search.batch_size is None


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


def test_bad_settings_are_plan_errors(tiny_configs: dict) -> None:
    planner = Planner(tiny_configs["bert"], "sequence-classification")
    with pytest.raises(PlanError, match="position embeddings"):
        planner.plan(PlanSettings(seq_len=4096))
    with pytest.raises(PlanError, match="unknown GPU"):
        planner.plan(PlanSettings(batch_size=1, seq_len=16), gpu="Z80")
    with pytest.raises(PlanError, match="optimizer"):
        planner.plan(PlanSettings(optimizer="lion"))
    with pytest.raises(PlanError, match="task"):
        Planner(tiny_configs["bert"], "translation")


@pytest.mark.slow
def test_llama_7b_parameter_count_and_states(tiny_configs: dict) -> None:
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
        PlanSettings(batch_size=1, seq_len=512, precision=Precision.BF16_MIXED)
    )
    params = 2 * vocab * h + layers * (4 * h * h + 3 * h * inter + 2 * h) + h
    assert result.parameter_count == params == 6_738_415_616
    assert result.components[Component.OPTIMIZER_STATES] >= 8 * params
    assert "extrapolated" in " ".join(result.notes)


def test_savings_are_peak_differences(tiny_configs: dict) -> None:
    """What the advisor gets as ``savings``: the peak each technique alone removes, per the plan."""
    planner = Planner(tiny_configs["llama"], "causal-lm")
    settings = PlanSettings(batch_size=4, seq_len=64)
    savings = planner.savings(settings)
    base = planner.plan(settings).peak_bytes
    assert set(savings) == {GRAD_ACCUM, CHECKPOINTING, "mixed_precision", "adamw_8bit", "adafactor"}
    ckpt = planner.plan(replace(settings, gradient_checkpointing=True)).peak_bytes
    assert savings[CHECKPOINTING] == max(0, base - ckpt)
    assert all(v >= 0 for v in savings.values())


def test_encoder_decoder_is_refused_clearly() -> None:
    from transformers import T5Config

    with pytest.raises(PlanError, match="encoder-decoder"):
        Planner(T5Config(d_model=32, num_layers=1, num_heads=2, d_kv=16, d_ff=64), name="t5")


def test_best_combination_is_the_baseline_when_it_fits(tiny_configs: dict) -> None:
    planner = Planner(tiny_configs["bert"], "sequence-classification")
    rows = technique_table(
        planner, PlanSettings(batch_size=2, seq_len=32, precision=Precision.BF16_MIXED), "H100"
    )
    best = rows[-1]
    assert best.keys == () and best.label == "best combination: baseline as is"
    assert best.speed_factor == 1.0 and best.fits is True


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
        name, total, source = resolve_gpu(None)
    finally:
        uninstall()
        nvml_gpu.cache_clear()
    assert (name, total, source) == (*expected, "NVML")
    assert "H100" in name
    # Without NVML: the guide's V100, said so.
    assert resolve_gpu(None)[2].startswith("default")
