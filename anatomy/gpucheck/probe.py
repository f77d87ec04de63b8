"""Is there a CUDA device to check? One line saying why not, or None."""

from __future__ import annotations


def cuda_missing() -> str | None:
    """Why there is nothing to check here (torch missing, a CPU-only build, no device or driver), or None
    when ``cuda:0`` can be used."""
    try:
        import torch
    except Exception as exc:  # an absent or broken torch: nothing to check, said in one line
        return f"torch cannot be imported ({type(exc).__name__}: {exc})"
    if getattr(torch.version, "cuda", None) is None:
        return f"torch {torch.__version__} is a CPU-only build"
    try:
        if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
            return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no CUDA device or driver"
    except Exception as exc:
        return f"CUDA is not usable ({type(exc).__name__}: {exc})"
    return None
