"""What a plan is asked for (anatomy.plan.settings): typed settings and the checks needing no model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from anatomy.plan.settings import (
    MAX_TOKENS,
    PlanError,
    PlanSettings,
    Target,
    Task,
    check_gpu,
    check_settings,
)


def test_strings_become_enums() -> None:
    s = PlanSettings(task="seq2seq-lm", target="cpu")
    assert s.task is Task.SEQ2SEQ_LM and s.target is Target.CPU
    assert s.to_dict()["task"] == "seq2seq-lm" and s.to_dict()["target"] == "cpu"
    with pytest.raises(PlanError, match="unknown task 'translation'"):
        PlanSettings(task="translation")
    with pytest.raises(PlanError, match="unknown target"):
        PlanSettings(target="tpu")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (PlanSettings(batch_size=0), "batch size must be a whole number >= 1"),
        (PlanSettings(grad_accum=0), "gradient accumulation must be"),
        (PlanSettings(seq_len=0), "sequence length must be"),
        (PlanSettings(batch_size=10**12), r"batch size 1,000,000,000,000 is more than a plan can model"),
        (PlanSettings(batch_size=MAX_TOKENS // 512 + 1), "tokens per micro-batch"),
        (PlanSettings(batch_size=1, seq_len=(1 << 22) + 1), "sequence length 4,194,305"),
        (PlanSettings(task="image-classification", image_size=1 << 16), "image size"),
        (PlanSettings(task="image-classification", batch_size=1 << 20, image_size=1024), "pixels"),
        (PlanSettings(task="causal-lm", image_size=64), "--image-size applies to image-classification"),
        (PlanSettings(task="image-classification", seq_len=64), "--seq-len does not apply"),
        (PlanSettings(task="image-classification", padded=True), "--padding applies to token inputs"),
        (PlanSettings(optimizer="lion"), "unknown optimizer 'lion'"),
        (PlanSettings(optimizer_impl="magic"), "unknown optimizer implementation"),
    ],
)
def test_bad_settings(settings: PlanSettings, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        check_settings(settings)


def test_largest_plannable_batch_is_accepted() -> None:
    check_settings(PlanSettings(batch_size=MAX_TOKENS // 512, seq_len=512))


@pytest.mark.parametrize(
    ("gpu", "gpu_bytes", "target", "message"),
    [
        ("0GiB", None, Target.CUDA, "is 0 bytes: a GPU has at least 1 MiB"),
        ("0.0001MiB", None, Target.CUDA, "at least 1 MiB"),
        ("Z80", None, Target.CUDA, "unknown GPU 'Z80'"),
        ("Z80", None, Target.CPU, "unknown GPU 'Z80'"),
        ("H100", None, Target.CPU, "does not apply to --target cpu"),
        (None, -5, Target.CUDA, "at least 1 MiB"),
    ],
)
def test_bad_gpu(gpu: str | None, gpu_bytes: int | None, target: Target, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        check_gpu(gpu, gpu_bytes, target)


def test_good_gpu() -> None:
    check_gpu("h100 80gb", None, Target.CUDA)
    check_gpu("24GiB", None, Target.CUDA)
    check_gpu(None, None, Target.CPU)


def test_settings_module_is_stdlib_only() -> None:
    """The CLI checks its arguments here before torch is imported."""
    code = (
        "import sys, anatomy.plan.settings, anatomy.plan.report, anatomy.plan_cli; "
        "print('torch' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
