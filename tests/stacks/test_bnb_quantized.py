"""bitsandbytes 4-bit (nf4 with double quantization, fp4) and 8-bit weights, trained on CPU (a frozen
quantized base, trainable fp32 adapters): the parameter count is logical (a packed 4-bit weight counts its
unpacked elements), weights include the quantization state (block scales, code books, the nested state of
double quantization, 8-bit row scales), the hello names the format, and bytes per parameter divide by the
right counts. Each figure against the test's own count of the tensors, the quantization state read
attribute by attribute; the training is bit-identical with and without the hook.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import bitsandbytes as bnb
import pytest
import torch

import anatomy
from anatomy.vocabulary import Component, Precision

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

HIDDEN, STEPS = 128, 3


def _run(
    st: SimpleNamespace,
    kind: str,
    hooked: bool,
    count_states: Callable[[torch.optim.Optimizer], int] | None = None,
) -> tuple[list[float], Any, anatomy.Tracker | None, list[int]]:
    """(losses, model, tracker, the optimizer's state bytes after each update by ``count_states``)."""
    model = st.QuantizedNet(kind, hidden=HIDDEN)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, HIDDEN, generator=g), torch.randint(0, 8, (16,), generator=g)
    tracker = anatomy.track(model, opt, publish=False) if hooked else None
    losses, states = [], []
    for _ in range(STEPS):
        if tracker is not None:
            tracker.begin_step()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if count_states is not None:
            states.append(count_states(opt))
        opt.zero_grad()
        if tracker is not None:
            tracker.end_step()
        losses.append(float(loss.detach()))
    return losses, model, tracker, states


@pytest.mark.parametrize("kind", ["nf4", "fp4", "int8"])
def test_quantized_weights_their_state_and_logical_count(st: SimpleNamespace, kind: str) -> None:
    plain, _, _, _ = _run(st, kind, hooked=False)
    losses, model, tracker, states = _run(st, kind, hooked=True, count_states=st.state_bytes)
    assert tracker is not None
    assert losses == plain  # bit-identical
    assert losses[-1] < losses[0]  # the adapters train through the quantized layers

    logical, weights, state_bytes = st.quantized_counts(model)
    quantized = [p for layer in model.layers for p in layer.parameters()]
    packed = [p for p in quantized if getattr(p, "quant_state", None) is not None]
    if kind != "int8":  # two 4-bit weights per uint8 element: the packed count would be far off
        assert sum(p.numel() for p in packed) * 2 == sum(
            int(torch.Size(p.quant_state.shape).numel()) for p in packed
        )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    assert state_bytes > 0

    hello, snap = tracker.hello, tracker.history[-1]
    history = list(tracker.history)
    tracker.close()
    # Optimizer states against the training process's own count after each update (every tensor in
    # optimizer.state, each storage once): AdamW's two moments and step of the trainable adapters and head.
    assert [s.step for s in history] == list(range(STEPS))
    assert [s.memory[Component.OPTIMIZER_STATES.value] for s in history] == states
    assert states[-1] >= 2 * trainable * 4
    # The precision is the floating-point training's (README: the guide's figures follow the detected
    # precision; a quantized base has no weight figure): fp32 adapters and compute over the packed base,
    # the packed format named apart in weight_quantization — never a precision of its own.
    assert hello.precision == Precision.FP32.value
    assert hello.parameter_count == snap.parameter_count == logical
    assert hello.trainable_parameter_count == snap.trainable_parameter_count == trainable
    assert hello.weight_quantization == kind
    assert snap.memory[Component.WEIGHTS.value] == weights  # with the quantization state
    assert snap.memory[Component.GRADIENTS.value] == trainable * 4
    assert snap.expected_bytes_per_param[Component.WEIGHTS.value] is None  # no guide figure for 4/8-bit
    assert snap.expected_bytes_per_param[Component.OPTIMIZER_STATES.value] == 8.0
    assert snap.expected_bytes_per_param[Component.GRADIENTS.value] == 4.0


def test_4bit_precision_follows_the_floating_weights() -> None:
    """QLoRA's usual set-up, a bf16 compute dtype with bf16 biases and head over an nf4 base: the hello says
    bf16 (the packed uint8 storage is no precision; fp32 above is the adapters', not a default)."""
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(
        bnb.nn.Linear4bit(HIDDEN, HIDDEN, compute_dtype=torch.bfloat16, quant_type="nf4")
        .to(torch.bfloat16)
        .to("cpu")
        for _ in range(2)
    )
    layers.requires_grad_(False)
    model = torch.nn.Sequential(*layers, torch.nn.Linear(HIDDEN, 8).to(torch.bfloat16))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    tracker = anatomy.track(model, opt, publish=False)
    x = torch.randn(4, HIDDEN, dtype=torch.bfloat16)
    for _ in range(2):
        with tracker.step():
            model(x).float().pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    hello = tracker.hello
    tracker.close()
    assert all(p.dtype == torch.uint8 for layer in layers for p in [layer.weight])
    assert hello.precision == Precision.BF16.value
    assert hello.weight_quantization == "nf4"
