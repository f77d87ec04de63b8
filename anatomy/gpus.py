"""Named GPU memory sizes for `anatomy-top plan --gpu NAME`. Stdlib only (the monitor may import it).

Figures are the total memory NVML / nvidia-smi report for the board (MiB), so a plan checked against a
name fits the same number a live run would see. Where no nvidia-smi figure was at hand the marketing
size in GiB is used; both are marked below.
"""

from __future__ import annotations

import re

MIB = 1 << 20
GIB = 1 << 30

# name -> total bytes. Keys are canonical names; lookups ignore case, spaces, dashes and underscores.
GPU_MEMORY: dict[str, int] = {
    "V100-16GB": 16160 * MIB,  # nvidia-smi in the training-anatomy guide (Tesla V100-SXM2-16GB)
    "V100-32GB": 32510 * MIB,  # nvidia-smi, Tesla V100-SXM2-32GB
    "T4": 15360 * MIB,  # nvidia-smi, Tesla T4
    "A10": 23028 * MIB,  # nvidia-smi, NVIDIA A10 / A10G
    "A10G": 23028 * MIB,
    "L4": 23034 * MIB,  # nvidia-smi, NVIDIA L4
    "A100-40GB": 40960 * MIB,  # nvidia-smi, A100-SXM4-40GB
    "A100-80GB": 81920 * MIB,  # nvidia-smi, A100-SXM4-80GB
    "L40S": 46068 * MIB,  # nvidia-smi, NVIDIA L40S
    "RTX-3090": 24576 * MIB,  # marketing 24 GiB
    "RTX-4090": 24564 * MIB,  # nvidia-smi, GeForce RTX 4090
    "H100-80GB": 81559 * MIB,  # nvidia-smi, H100 80GB HBM3 (SXM)
    "H100-94GB": 95830 * MIB,  # nvidia-smi, H100 NVL
    "H200": 143771 * MIB,  # nvidia-smi, H200 141GB
    "B200": 183359 * MIB,  # nvidia-smi, B200 (180 GB usable)
}

# Short aliases people type.
_ALIASES: dict[str, str] = {
    "V100": "V100-16GB",
    "A100": "A100-80GB",
    "H100": "H100-80GB",
    "3090": "RTX-3090",
    "4090": "RTX-4090",
    "H200-141GB": "H200",
}

DEFAULT_GPU = "V100-16GB"  # the guide's GPU: the default when neither --gpu nor NVML names one

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(gib|gb|g|mib|mb|m)\s*$", re.IGNORECASE)


def _norm(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).upper()


_INDEX: dict[str, str] = {_norm(k): k for k in GPU_MEMORY} | {_norm(k): v for k, v in _ALIASES.items()}


def canonical_name(name: str) -> str | None:
    """The table's name for ``name`` (case, spaces and dashes ignored), or None if unknown."""
    return _INDEX.get(_norm(name))


def gpu_memory_bytes(name: str) -> int | None:
    """Total memory of a named GPU, or of an explicit size like ``24GiB`` / ``24GB`` / ``16384MiB``.
    GB and GiB are both read as GiB: GPU marketing sizes are binary."""
    canonical = canonical_name(name)
    if canonical is not None:
        return GPU_MEMORY[canonical]
    m = _SIZE_RE.match(name)
    if m:
        value, unit = float(m.group(1)), m.group(2).lower()
        scale = GIB if unit.startswith("g") else MIB
        return int(value * scale)
    return None


def match_device_name(device_name: str, total_bytes: int | None = None) -> str | None:
    """Map an NVML device name (``NVIDIA A100-SXM4-80GB``) to a table name, or None."""
    upper = device_name.upper()
    for family in ("B200", "H200", "H100", "A100", "V100", "L40S", "A10G", "A10", "L4", "T4"):
        if re.search(rf"(?<![A-Z0-9]){family}(?![0-9])", upper):
            candidates = [k for k in GPU_MEMORY if k == family or k.startswith(family + "-")]
            if len(candidates) == 1 or total_bytes is None:
                gb = re.search(r"(\d+)\s*GB", upper)
                for c in candidates:
                    if gb and c.endswith(f"-{gb.group(1)}GB"):
                        return c
                return candidates[0] if candidates else None
            return min(candidates, key=lambda c: abs(GPU_MEMORY[c] - total_bytes))
    for num in ("4090", "3090"):
        if num in upper:
            return f"RTX-{num}"
    return None


def names() -> list[str]:
    return sorted(GPU_MEMORY)


# Tensor-core generations by device-name pattern (first match wins). Volta/Turing have fp16 tensor
# cores only; Ampere and later add TF32 and bf16.
_GENERATIONS: tuple[tuple[str, str], ...] = (
    (r"\bGB?200\b|\bB100\b|\bB200\b|RTX 50\d\d", "blackwell"),
    (r"\bGH200\b|\bH100\b|\bH200\b|\bH800\b|\bH20\b", "hopper"),
    (r"\bL4\b|\bL40S?\b|RTX 40\d\d|RTX \d000 ADA", "ada"),
    (r"\bA100\b|\bA800\b|\bA10G?\b|\bA30\b|\bA40\b|\bA16\b|\bA2\b|RTX 30\d\d|RTX A\d+", "ampere"),
    (r"\bT4\b|RTX 20\d\d|QUADRO RTX|TITAN RTX", "turing"),
    (r"\bV100\b|TITAN V\b", "volta"),
)
TF32_GENERATIONS = frozenset({"ampere", "ada", "hopper", "blackwell"})


def generation(device_name: str | None) -> str | None:
    """Tensor-core generation of an NVML device name, or None (no tensor cores, CPU, or unknown)."""
    if not device_name:
        return None
    upper = device_name.upper()
    for pattern, gen in _GENERATIONS:
        if re.search(pattern, upper):
            return gen
    return None


def tensor_core_multiple(device_name: str | None) -> int:
    """The guide: "For FP16 a multiple of 8 is recommended, but on A100 it's 64"."""
    return 64 if device_name and re.search(r"\bA100\b", device_name.upper()) else 8
