"""The plan against what the anatomy hook (anatomy.track) measures on the real run of the same step."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

import anatomy
from anatomy.plan import Planner, PlanSettings, build_model, enable_checkpointing, make_inputs
from anatomy.vocabulary import Component, Precision


def _hook_run(planner: Planner, settings: PlanSettings, steps: int = 3) -> Any:
    torch.manual_seed(0)
    workload = planner.workload(settings)[0]
    model = build_model(planner.config, planner.task)
    model.train()
    if settings.gradient_checkpointing:
        enable_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tracker = anatomy.track(model, optimizer, publish=False)
    autocast = (
        (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
        if settings.precision is Precision.BF16_MIXED
        else contextlib.nullcontext
    )
    try:
        for _ in range(steps):
            with tracker.step():
                optimizer.zero_grad(set_to_none=True)
                inputs = make_inputs(planner.config, workload)
                with autocast():
                    out = model(**inputs)
                out.loss.backward()
                optimizer.step()
        snapshot = tracker.latest
    finally:
        tracker.close()
    assert snapshot is not None and snapshot.error is None
    return snapshot


@pytest.mark.parametrize(
    ("family", "task", "precision", "checkpointing"),
    [
        ("bert", "sequence-classification", Precision.FP32, False),
        ("gpt2", "causal-lm", Precision.BF16_MIXED, False),
        ("llama", "causal-lm", Precision.FP32, True),
    ],
)
def test_plan_matches_hook(
    family: str, task: str, precision: Precision, checkpointing: bool, tiny_configs: dict[str, Any]
) -> None:
    planner = Planner(tiny_configs[family], task)
    settings = PlanSettings(
        batch_size=4,
        seq_len=64,
        target="cpu",
        precision=precision,
        gradient_checkpointing=checkpointing,
        padded=False,
    )
    result = planner.plan(settings)
    snap = _hook_run(planner, settings)
    measured = snap.memory
    for comp in (Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES):
        assert result.components[comp] == measured[comp.value], comp
    assert result.components[Component.ACTIVATIONS] == pytest.approx(
        measured[Component.ACTIVATIONS.value], rel=0.05
    )
    # On CPU the hook reads the heap at phase boundaries, so its peak is a lower bound of the true one:
    # it misses a peak inside backward (up to ~27% lower with checkpointing's recompute). The peak is
    # checked against a per-op heap reading in test_plan_accuracy.py; here the plan must not be below.
    # The hook's CPU peak is the whole heap in use (F1); without what the process holds outside the
    # training tensors (the split's runtime and unattributed rows) it is the tensors' peak the plan predicts.
    assert snap.peak_bytes is not None and snap.at_peak is not None
    outside = (Component.RUNTIME.value, Component.UNATTRIBUTED.value)
    tensors_peak = snap.peak_bytes - sum(snap.at_peak.get(c) or 0 for c in outside)
    assert result.peak_bytes >= tensors_peak * 0.98
