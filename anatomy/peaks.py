"""Dense peak FLOP/s of the GPUs people train on, for model-FLOPs utilisation (MFU).

Stdlib only. Every figure is the vendor's *dense* number (datasheets quote tensor-core figures "with
sparsity", which are twice the dense ones; we halve those). GeForce cards are quoted with FP32
accumulate, which is what mixed-precision training uses (their FP16-accumulate figure is twice as high).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from anatomy.vocabulary import Precision

_T = 1e12


@dataclass(frozen=True)
class _Peaks:
    fp32: float  # CUDA-core FP32 (no tensor cores)
    tf32: float | None  # TF32 tensor cores; None where the GPU has none (Volta)
    fp16: float  # FP16 tensor cores, FP32 accumulate
    bf16: float | None  # None where the GPU has no BF16 (Volta)


# (pattern on the NVML device name, peaks). First match wins, so the more specific names come first.
# NVML names look like "Tesla V100-SXM2-32GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe",
# "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA GeForce RTX 4090".
_TABLE: tuple[tuple[re.Pattern[str], _Peaks], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), peaks)
    for pattern, peaks in (
        # Tesla V100 datasheet (2020): SXM2 15.7 FP32, 125 tensor; PCIe 14 / 112; V100S PCIe 16.4 / 130.
        (r"\bV100S\b", _Peaks(fp32=16.4 * _T, tf32=None, fp16=130 * _T, bf16=None)),
        (r"\bV100\b.*\bPCIE\b", _Peaks(fp32=14.0 * _T, tf32=None, fp16=112 * _T, bf16=None)),
        (r"\bV100\b", _Peaks(fp32=15.7 * _T, tf32=None, fp16=125 * _T, bf16=None)),
        # A100 datasheet (40GB and 80GB, SXM4 and PCIe alike): 19.5 FP32, TF32 156 (312 sparse),
        # FP16/BF16 312 (624 sparse).
        (r"\bA100\b", _Peaks(fp32=19.5 * _T, tf32=156 * _T, fp16=312 * _T, bf16=312 * _T)),
        # A10 datasheet: 31.2 FP32, TF32 62.5 (125 sparse), BF16/FP16 125 (250 sparse).
        # "A10G" (AWS) is a different part: \b keeps it out.
        (r"\bA10\b", _Peaks(fp32=31.2 * _T, tf32=62.5 * _T, fp16=125 * _T, bf16=125 * _T)),
        # L40S datasheet: 91.6 FP32, TF32 183 (366 sparse), BF16/FP16 362.05 (733 sparse).
        (r"\bL40S\b", _Peaks(fp32=91.6 * _T, tf32=183 * _T, fp16=362.05 * _T, bf16=362.05 * _T)),
        # L4 datasheet: 30.3 FP32, TF32 60 (120 sparse), BF16/FP16 121 (242 sparse).
        (r"\bL4\b", _Peaks(fp32=30.3 * _T, tf32=60 * _T, fp16=121 * _T, bf16=121 * _T)),
        # NVIDIA Ampere GA102 whitepaper, RTX 3090: 35.6 FP32, TF32 35.6, FP16/BF16 (FP32 acc.) 71.
        (r"\bRTX 3090\b(?! Ti)", _Peaks(fp32=35.6 * _T, tf32=35.6 * _T, fp16=71 * _T, bf16=71 * _T)),
        # NVIDIA Ada Lovelace whitepaper, RTX 4090: 82.6 FP32, TF32 82.6, FP16/BF16 (FP32 acc.) 165.2.
        (r"\bRTX 4090\b(?! D)", _Peaks(fp32=82.6 * _T, tf32=82.6 * _T, fp16=165.2 * _T, bf16=165.2 * _T)),
        # H100 datasheet: PCIe 51 FP32, TF32 378 (756 sparse), BF16/FP16 756 (1513 sparse);
        # NVL 60 FP32, TF32 417.5 (835 sparse), BF16/FP16 835.5 (1671 sparse);
        # SXM 67 FP32, TF32 494.7 (989 sparse), BF16/FP16 989.4 (1979 sparse).
        (r"\bH100\b.*\bPCIE\b", _Peaks(fp32=51 * _T, tf32=378 * _T, fp16=756 * _T, bf16=756 * _T)),
        (r"\bH100 NVL\b", _Peaks(fp32=60 * _T, tf32=417.5 * _T, fp16=835.5 * _T, bf16=835.5 * _T)),
        (r"\bH100\b", _Peaks(fp32=67 * _T, tf32=494.7 * _T, fp16=989.4 * _T, bf16=989.4 * _T)),
        # GH200 datasheet: the Hopper GPU of the superchip has the H100 SXM figures.
        (r"\bGH200\b", _Peaks(fp32=67 * _T, tf32=494.7 * _T, fp16=989.4 * _T, bf16=989.4 * _T)),
        # H200 datasheet: NVL 60 FP32, TF32 417.5 (835 sparse), BF16/FP16 835.5 (1671 sparse);
        # SXM as H100 SXM: 67, 494.7 (989 sparse), 989.4 (1979 sparse).
        (r"\bH200 NVL\b", _Peaks(fp32=60 * _T, tf32=417.5 * _T, fp16=835.5 * _T, bf16=835.5 * _T)),
        (r"\bH200\b", _Peaks(fp32=67 * _T, tf32=494.7 * _T, fp16=989.4 * _T, bf16=989.4 * _T)),
        # HGX B200 datasheet (per GPU, 1000 W): 80 FP32, TF32 1100 (2200 sparse),
        # BF16/FP16 2250 (4500 sparse).
        (r"\bB200\b", _Peaks(fp32=80 * _T, tf32=1100 * _T, fp16=2250 * _T, bf16=2250 * _T)),
    )
)


def _lookup(device_name: str) -> _Peaks | None:
    for pattern, peaks in _TABLE:
        if pattern.search(device_name):
            return peaks
    return None


def peak_flops(device_name: str, precision: Precision | str, tf32: bool = False) -> float | None:
    """Dense peak FLOP/s of ``device_name`` (the NVML / ``torch.cuda.get_device_name`` name) for the
    precision the matmuls run in: fp16/bf16 tensor cores for (mixed) half precision; for fp32 the
    TF32 tensor-core peak when ``tf32`` is on (``torch.backends.cuda.matmul.allow_tf32``), else the
    plain FP32 one. None for CPUs, unknown GPUs, and precisions the GPU lacks (BF16 on V100)."""
    try:
        precision = Precision(precision)
    except ValueError:
        return None
    peaks = _lookup(device_name or "")
    if peaks is None:
        return None
    if precision in (Precision.FP16, Precision.FP16_MIXED):
        return peaks.fp16
    if precision in (Precision.BF16, Precision.BF16_MIXED):
        return peaks.bf16
    if tf32 and peaks.tf32 is not None:
        return peaks.tf32
    return peaks.fp32
