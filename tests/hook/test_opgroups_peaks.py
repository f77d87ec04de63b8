"""anatomy.peaks: dense peak FLOP/s by NVML device name and precision."""

from __future__ import annotations

import pytest

from anatomy.peaks import peak_flops
from anatomy.vocabulary import Precision

T = 1e12


@pytest.mark.parametrize(
    ("name", "precision", "tf32", "expected"),
    [
        ("Tesla V100-SXM2-16GB", Precision.FP16_MIXED, False, 125 * T),
        ("Tesla V100-SXM2-32GB", Precision.FP32, True, 15.7 * T),  # no TF32 on Volta
        ("Tesla V100-PCIE-16GB", Precision.FP16, False, 112 * T),
        ("Tesla V100S-PCIE-32GB", Precision.FP16_MIXED, False, 130 * T),
        ("NVIDIA A100-SXM4-40GB", Precision.BF16_MIXED, False, 312 * T),
        ("NVIDIA A100-SXM4-80GB", Precision.FP32, True, 156 * T),
        ("NVIDIA A100-SXM4-80GB", Precision.FP32, False, 19.5 * T),
        ("NVIDIA A100 80GB PCIe", Precision.FP16_MIXED, False, 312 * T),
        ("NVIDIA A100-PCIE-40GB", Precision.FP32, True, 156 * T),
        ("NVIDIA A10", Precision.BF16_MIXED, False, 125 * T),
        ("NVIDIA L4", Precision.FP16_MIXED, False, 121 * T),
        ("NVIDIA L40S", Precision.BF16, False, 362.05 * T),
        ("NVIDIA GeForce RTX 3090", Precision.FP16_MIXED, False, 71 * T),
        ("NVIDIA GeForce RTX 4090", Precision.BF16_MIXED, False, 165.2 * T),
        ("NVIDIA H100 80GB HBM3", Precision.BF16_MIXED, False, 989.4 * T),
        ("NVIDIA H100 80GB HBM3", Precision.FP32, True, 494.7 * T),
        ("NVIDIA H100 PCIe", Precision.BF16_MIXED, False, 756 * T),
        ("NVIDIA H100 NVL", Precision.FP16_MIXED, False, 835.5 * T),
        ("NVIDIA H200", Precision.BF16_MIXED, False, 989.4 * T),
        ("NVIDIA H200 NVL", Precision.BF16_MIXED, False, 835.5 * T),
        ("NVIDIA B200", Precision.BF16_MIXED, False, 2250 * T),
        ("NVIDIA B200", Precision.FP32, False, 80 * T),
    ],
)
def test_known_gpus(name: str, precision: Precision, tf32: bool, expected: float) -> None:
    assert peak_flops(name, precision, tf32=tf32) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("name", "precision"),
    [
        ("cpu", Precision.FP32),
        ("", Precision.BF16_MIXED),
        ("NVIDIA A10G", Precision.BF16_MIXED),  # a different part from the A10
        ("NVIDIA GeForce RTX 3090 Ti", Precision.FP16_MIXED),
        ("NVIDIA GeForce RTX 4090 D", Precision.FP16_MIXED),
        ("NVIDIA GH100-unknown-sample", Precision.FP32),
        ("Tesla V100-SXM2-16GB", Precision.BF16_MIXED),  # Volta has no bf16
        ("NVIDIA H100 80GB HBM3", "int4"),
    ],
)
def test_unknown_devices_and_precisions_give_none(name: str, precision: Precision | str) -> None:
    assert peak_flops(name, precision) is None


def test_string_precision_values_are_accepted() -> None:
    assert peak_flops("NVIDIA A100-SXM4-80GB", "bf16_mixed") == peak_flops(
        "NVIDIA A100-SXM4-80GB", Precision.BF16_MIXED
    )


def test_tensor_core_peaks_dominate_fp32_on_every_listed_gpu() -> None:
    names = ["Tesla V100-SXM2-16GB", "NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA H100 PCIe", "NVIDIA B200"]
    for name in names:
        fp32, fp16 = peak_flops(name, Precision.FP32), peak_flops(name, Precision.FP16_MIXED)
        assert fp32 is not None and fp16 is not None and fp16 > 3 * fp32, name
