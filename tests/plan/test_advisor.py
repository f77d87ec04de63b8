"""The live advisor: each rule fires on a snapshot built to trigger it, with the right number and
source, and nothing fires on a healthy run."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from anatomy import protocol
from anatomy.advisor import advise
from anatomy.protocol import CudaMemory, Hello, Snapshot
from anatomy.techniques import CHECKPOINTING, TECHNIQUES
from anatomy.vocabulary import Component, Phase, Source

GIB = 1 << 30
MIB = 1 << 20


def hello(**kw: Any) -> Hello:
    base: dict[str, Any] = {
        "pid": 42,
        "host": "box",
        "device": "cuda:0",
        "precision": "bf16_mixed",
        "optimizer": "adamw",
        "model_class": "LlamaForCausalLM",
        "parameter_count": 1_000_000_000,
        "torch_version": "2.13",
        "started_at": 0.0,
        "device_name": "NVIDIA A100-SXM4-80GB",
        "device_memory_bytes": 80 * GIB,
        "vocab_size": 32000,
        "tf32": None,
    }
    base.update(kw)
    return Hello(**base)


def snapshot(step: int = 10, **kw: Any) -> Snapshot:
    memory = {
        Component.WEIGHTS.value: 6 * GIB,
        Component.OPTIMIZER_STATES.value: 8 * GIB,
        Component.GRADIENTS.value: 4 * GIB,
        Component.ACTIVATIONS.value: 10 * GIB,
        Component.TEMPORARIES.value: 1 * GIB,
        Component.CUDA_CONTEXT.value: 1 * GIB,
        Component.ALLOCATOR_CACHE.value: 2 * GIB,
    }
    memory.update(kw.pop("memory", {}))
    base: dict[str, Any] = {
        "pid": 42,
        "seq": step,
        "time": float(step),
        "step": step,
        "memory": memory,
        "expected_bytes_per_param": {},
        "parameter_count": 1_000_000_000,
        "peak_bytes": 30 * GIB,
        "peak_phase": Phase.BACKWARD.value,
        "cuda": CudaMemory(
            allocated=18 * GIB, reserved=32 * GIB, peak_allocated=30 * GIB, alloc_retries=0, ooms=0
        ),
        "batch_size": 64,
    }
    base.update(kw)
    return Snapshot(**base)


def flat_history(n: int = 12) -> list[Snapshot]:
    return [snapshot(step=i) for i in range(1, n + 1)]


def rules(suggestions: list[protocol.Suggestion]) -> list[str]:
    return [s.rule for s in suggestions]


def test_healthy_gpu_run_gets_nothing() -> None:
    assert advise(hello(), snapshot(), flat_history()) == []


def test_healthy_cpu_run_gets_nothing() -> None:
    h = hello(device="cpu", device_name=None, device_memory_bytes=None, precision="fp32")
    s = snapshot(cuda=None, memory={Component.UNATTRIBUTED.value: 50 * MIB})
    assert advise(h, s, [replace(s, step=i, seq=i) for i in range(1, 12)]) == []


def _tight(**kw: Any) -> Snapshot:
    # 75 GiB peak + 1 GiB context on an 80 GiB GPU: over the 85% pressure line.
    return snapshot(
        peak_bytes=75 * GIB,
        cuda=CudaMemory(
            allocated=18 * GIB, reserved=76 * GIB, peak_allocated=75 * GIB, alloc_retries=0, ooms=0
        ),
        **kw,
    )


def test_activation_peak_under_pressure_suggests_checkpointing_and_accumulation() -> None:
    acts = 50 * GIB
    s = _tight(memory={Component.ACTIVATIONS.value: acts}, peak_phase=Phase.BACKWARD.value, batch_size=8)
    out = advise(hello(), s)
    by_rule = {x.rule: x for x in out}
    assert set(by_rule) == {"gradient_checkpointing", "gradient_accumulation"}
    ckpt = by_rule["gradient_checkpointing"]
    assert ckpt.saving_bytes == int(acts * 0.9)
    assert ckpt.source == Source.PREDICTED.value
    assert ckpt.speed_factor == TECHNIQUES[CHECKPOINTING].speed_factor
    accum = by_rule["gradient_accumulation"]
    assert accum.saving_bytes == int(acts * (1 - 1 / 4))  # batch 8 -> 2 x 4
    assert "8 -> 2 x 4" in accum.title
    assert "during backward" in ckpt.detail
    # Ranked by saving.
    assert rules(out) == ["gradient_checkpointing", "gradient_accumulation"]


def test_plan_savings_replace_the_formula() -> None:
    s = _tight(peak_phase=Phase.FORWARD.value)
    out = advise(hello(), s, savings={CHECKPOINTING: 1234 * MIB})
    ckpt = next(x for x in out if x.rule == "gradient_checkpointing")
    assert ckpt.saving_bytes == 1234 * MIB and "plan" in ckpt.detail


def test_batch_of_three_accumulates_in_three() -> None:
    s = _tight(batch_size=3)
    accum = next(x for x in advise(hello(), s) if x.rule == "gradient_accumulation")
    assert accum.saving_bytes == int(10 * GIB * (1 - 1 / 3))


def test_optimizer_peak_suggests_8bit_adamw_and_adafactor() -> None:
    states = 24 * GIB
    s = _tight(memory={Component.OPTIMIZER_STATES.value: states}, peak_phase=Phase.OPTIMIZER.value)
    out = advise(hello(), s)
    by_rule = {x.rule: x for x in out}
    assert set(by_rule) == {"adamw_8bit", "adafactor"}
    assert by_rule["adamw_8bit"].saving_bytes == states * 6 // 8
    assert by_rule["adamw_8bit"].source == Source.PREDICTED.value
    assert by_rule["adafactor"].saving_bytes == states // 2
    assert by_rule["adafactor"].source == Source.GUIDE.value
    assert rules(out)[0] == "adamw_8bit"


def test_sgd_gets_no_optimizer_advice() -> None:
    s = _tight(peak_phase=Phase.OPTIMIZER.value, memory={Component.OPTIMIZER_STATES.value: 30 * GIB})
    assert advise(hello(optimizer="sgd_momentum"), s) == []


def test_oom_file_snapshot_is_pressure_without_device_size() -> None:
    s = snapshot(oom="CUDA out of memory. Tried to allocate 2.00 GiB", peak_phase=Phase.FORWARD.value)
    out = advise(hello(device_memory_bytes=None), s)
    assert "gradient_checkpointing" in rules(out)
    assert "out-of-memory" in out[0].detail


def test_fragmentation() -> None:
    cuda = CudaMemory(allocated=5 * GIB, reserved=40 * GIB, peak_allocated=22 * GIB, alloc_retries=0, ooms=0)
    out = advise(hello(), snapshot(cuda=cuda, peak_bytes=22 * GIB))
    assert rules(out) == ["fragmentation"]
    assert out[0].saving_bytes == 18 * GIB
    assert out[0].source == Source.MEASURED.value
    assert "expandable_segments:True" in out[0].detail


def test_allocator_retries_mean_pressure_and_fragmentation() -> None:
    cuda = CudaMemory(allocated=5 * GIB, reserved=31 * GIB, peak_allocated=30 * GIB, alloc_retries=3, ooms=0)
    out = advise(hello(), snapshot(cuda=cuda))
    assert rules(out)[0] == "fragmentation"
    assert "gradient_checkpointing" in rules(out)


def _growing(per_step: int, steps: int = 12) -> list[Snapshot]:
    out = []
    for i in range(1, steps + 1):
        cuda = CudaMemory(
            allocated=18 * GIB + i * per_step,
            reserved=32 * GIB + i * per_step,
            peak_allocated=30 * GIB + i * per_step,
            alloc_retries=0,
            ooms=0,
        )
        out.append(snapshot(step=i, cuda=cuda, peak_bytes=cuda.peak_allocated))
    return out


def test_leak_after_warmup() -> None:
    history = _growing(per_step=800 * MIB)
    out = advise(hello(), history[-1], history[:-1])
    assert rules(out)[0] == "leak"
    leak = out[0]
    assert leak.saving_bytes == (12 - 4) * 800 * MIB  # steps 4..12: warm-up steps 1-3 ignored
    assert "800.0 MiB/step" in leak.title
    assert leak.source == Source.MEASURED.value
    assert ".item()" in leak.detail


def test_small_or_noisy_growth_is_not_a_leak() -> None:
    tiny = _growing(per_step=64 * 1024)
    assert "leak" not in rules(advise(hello(), tiny[-1], tiny[:-1]))
    noisy = []
    for i in range(1, 13):
        alloc = 18 * GIB + (300 * MIB if i % 2 else 0)
        cuda = CudaMemory(
            allocated=alloc, reserved=32 * GIB, peak_allocated=30 * GIB, alloc_retries=0, ooms=0
        )
        noisy.append(snapshot(step=i, cuda=cuda))
    assert "leak" not in rules(advise(hello(), noisy[-1], noisy[:-1]))


def test_leak_on_cpu_from_unattributed_heap() -> None:
    h = hello(device="cpu", device_name=None, device_memory_bytes=None, precision="fp32")
    history = [
        snapshot(
            step=i,
            cuda=None,
            peak_bytes=300 * MIB,
            memory={Component.UNATTRIBUTED.value: 40 * MIB + i * 20 * MIB},
        )
        for i in range(1, 11)
    ]
    out = advise(h, history[-1], history[:-1])
    assert rules(out) == ["leak"] and out[0].saving_bytes == (10 - 4) * 20 * MIB


def test_fp32_on_ampere_suggests_tf32_and_bf16() -> None:
    out = advise(hello(precision="fp32", tf32=False), snapshot())
    assert rules(out) == ["tf32", "mixed_precision"]
    assert all(s.source == Source.GUIDE.value for s in out)
    assert "bf16" in out[1].title and out[1].speed_factor == round(18.64 / 8.86, 3)


def test_fp32_with_tf32_on_still_gets_mixed_precision_only() -> None:
    assert rules(advise(hello(precision="fp32", tf32=True), snapshot())) == ["mixed_precision"]


def test_fp32_on_volta_suggests_fp16_not_tf32() -> None:
    out = advise(
        hello(precision="fp32", device_name="Tesla V100-SXM2-16GB", device_memory_bytes=None), snapshot()
    )
    assert rules(out) == ["mixed_precision"] and "fp16" in out[0].title


def test_vocab_and_batch_off_tensor_core_multiples() -> None:
    out = advise(hello(vocab_size=50257), snapshot(batch_size=12))
    by_rule = {x.rule: x for x in out}
    # On an A100 the multiple is 64: a batch of 12 is too small to round to it.
    assert set(by_rule) == {"vocab_multiple"}
    assert "50304" in by_rule["vocab_multiple"].detail  # next multiple of 64 on an A100
    h100 = advise(hello(vocab_size=50257, device_name="NVIDIA H100 80GB HBM3"), snapshot(batch_size=12))
    by_rule = {x.rule: x for x in h100}
    assert set(by_rule) == {"vocab_multiple", "batch_multiple"}
    assert "50264" in by_rule["vocab_multiple"].detail  # multiple of 8 elsewhere
    assert "8 or 16" in by_rule["batch_multiple"].detail


def test_cpu_runs_get_no_tensor_core_advice() -> None:
    h = hello(device="cpu", precision="fp32", vocab_size=50257)
    assert advise(h, snapshot(cuda=None, batch_size=12)) == []


def test_suggestions_travel_over_the_protocol() -> None:
    history = _growing(per_step=800 * MIB)
    out = advise(hello(precision="fp32"), history[-1], history[:-1])
    assert out
    snap = replace(history[-1], suggestions=out)
    decoded = protocol.decode(protocol.encode(snap))
    assert isinstance(decoded, Snapshot) and decoded.suggestions == out


def test_advisor_module_is_stdlib_only() -> None:
    import subprocess
    import sys

    code = "import sys, anatomy.advisor; print('torch' in sys.modules, 'transformers' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.split() == ["False", "False"]


def test_no_title_repeats_the_saving_the_views_print_beside_it() -> None:
    """The views print "— saves X" from saving_bytes; a title that also said "~X less" read
    "~25.1 MiB less — saves 25.1 MiB"."""
    from anatomy.units import fmt_bytes

    cuda = CudaMemory(allocated=5 * GIB, reserved=40 * GIB, peak_allocated=22 * GIB, alloc_retries=0, ooms=0)
    cases = [
        advise(hello(), _tight(memory={Component.ACTIVATIONS.value: 50 * GIB}, batch_size=8)),
        advise(hello(), _tight(memory={Component.OPTIMIZER_STATES.value: 24 * GIB}, peak_phase="optimizer")),
        advise(hello(), snapshot(cuda=cuda, peak_bytes=22 * GIB)),
    ]
    suggestions = [s for out in cases for s in out]
    assert {s.rule for s in suggestions} >= {"gradient_checkpointing", "adamw_8bit", "fragmentation"}
    for s in suggestions:
        assert s.saving_bytes is not None
        assert fmt_bytes(s.saving_bytes) not in s.title and "less" not in s.title, s.title
