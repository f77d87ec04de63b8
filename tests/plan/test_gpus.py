"""Named GPU sizes and tensor-core generations."""

from __future__ import annotations

import pytest

from anatomy import gpus

MIB = 1 << 20


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("H100-80GB", 81559 * MIB),
        ("h100 80gb", 81559 * MIB),
        ("H100", 81559 * MIB),
        ("a100_40gb", 40960 * MIB),
        ("V100-16GB", 16160 * MIB),  # the guide's nvidia-smi
        ("24GiB", 24 << 30),
        ("16384MiB", 16384 * MIB),
        ("1.5 GB", int(1.5 * (1 << 30))),
    ],
)
def test_sizes(name: str, expected: int) -> None:
    assert gpus.gpu_memory_bytes(name) == expected


def test_unknown_name() -> None:
    assert gpus.gpu_memory_bytes("Z80") is None
    assert gpus.canonical_name("Z80") is None
    assert gpus.DEFAULT_GPU in gpus.names()


@pytest.mark.parametrize(
    ("device", "table", "generation", "multiple"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80GB", "ampere", 64),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB", "ampere", 64),
        ("Tesla V100-SXM2-16GB", "V100-16GB", "volta", 8),
        ("NVIDIA H100 80GB HBM3", "H100-80GB", "hopper", 8),
        ("NVIDIA GeForce RTX 4090", "RTX-4090", "ada", 8),
        ("Tesla T4", "T4", "turing", 8),
        ("NVIDIA A10G", "A10G", "ampere", 8),
        ("Tesla P100-PCIE-16GB", None, None, 8),
    ],
)
def test_device_names(device: str, table: str | None, generation: str | None, multiple: int) -> None:
    assert gpus.match_device_name(device) == table
    assert gpus.generation(device) == generation
    assert gpus.tensor_core_multiple(device) == multiple


def test_gpus_module_is_stdlib_only() -> None:
    import subprocess
    import sys

    code = "import sys, anatomy.gpus, anatomy.techniques; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
