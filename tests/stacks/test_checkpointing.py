"""Gradient checkpointing on a padded Hugging Face Llama: activations are what the forward really keeps.

A checkpointed layer keeps its inputs for the recomputation: the positional hidden states go through
saved-tensor hooks, but Hugging Face passes the rest — rotary cos/sin, ``position_ids`` and the (B, 1, S, S)
attention mask a padded batch needs — as keywords bound in a ``functools.partial``, with the CPU RNG state
in the checkpoint's closure, where no saved-tensor hook sees them. The oracle is independent of every hook:
torch's profiler records each allocation and free of the CPU allocator during a forward (of an identical
model on the same batch, without anatomy), and what that forward allocated and did not free is what it keeps
for backward (the 4-byte loss included). Activations must be within 0.5% of it.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import anatomy
from anatomy.vocabulary import Component

STEPS = 3


def _model(st: SimpleNamespace, reentrant: bool) -> torch.nn.Module:
    model = st.tiny_llama(seed=0)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    return model


def _train(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], tracked: bool
) -> tuple[list[float], object]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tracker = anatomy.track(model, opt, publish=False) if tracked else None
    losses = []
    for _ in range(STEPS):
        if tracker is not None:
            tracker.begin_step()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if tracker is not None:
            tracker.end_step()
        losses.append(float(loss.detach()))
    snap = tracker.latest if tracker is not None else None
    if tracker is not None:
        tracker.close()
    return losses, snap


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_checkpointed_padded_llama_activations_are_what_the_forward_keeps(
    st: SimpleNamespace, reentrant: bool
) -> None:
    batch = st.padded_batch(batch=4, seq=64)
    oracle_model = _model(st, reentrant)
    kept = st.forward_keeps(lambda: oracle_model(**batch).loss)
    assert kept > 0

    plain, _ = _train(_model(st, reentrant), batch, tracked=False)
    hooked, snap = _train(_model(st, reentrant), batch, tracked=True)
    assert hooked == plain  # bit-identical: the hook changes nothing the training computes

    assert snap is not None and snap.error is None
    acts = snap.memory[Component.ACTIVATIONS.value]
    assert acts is not None
    # The batch's own tensors existed before the step: inputs, not activations, and not in the oracle.
    assert acts == pytest.approx(kept, rel=0.005), (acts, kept, acts / kept - 1)


def test_the_mask_kept_by_every_checkpoint_counts_once(st: SimpleNamespace) -> None:
    """The (B, 1, S, S) mask is bound into every layer's checkpoint: counted once, so doubling the layers
    adds the layers' own inputs, not a second mask."""
    batch = st.padded_batch(batch=4, seq=64)
    counts = []
    for layers in (2, 4):
        model = st.tiny_llama(seed=0, layers=layers)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        kept = st.forward_keeps(lambda m=model: m(**batch).loss)
        _, snap = _train(model, batch, tracked=True)
        counts.append((snap.memory[Component.ACTIVATIONS.value], kept))
    (a2, k2), (a4, k4) = counts
    assert a4 - a2 == pytest.approx(k4 - k2, rel=0.01)
