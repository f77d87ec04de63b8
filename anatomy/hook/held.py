"""What the named tensors hold at one moment of a step: a leaf, so ``trace`` and ``record`` both import it
without importing each other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Held:
    """Bytes the named tensors hold at one moment of a step."""

    activations: int = 0
    weight_copies: int = 0  # autocast's low-precision copies of the weights
    gradients: int = 0
    optimizer_states: int = 0
