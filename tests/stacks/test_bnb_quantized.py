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

import bitsandbytes as bnb
import pytest
import torch

import anatomy
from anatomy.vocabulary import Component, Precision

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

HIDDEN, LAYERS, STEPS = 128, 3, 3


class _Quantized(torch.nn.Module):
    """Frozen quantized linear layers, each with a trainable low-rank adapter, and a trainable head."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(_layer(kind) for _ in range(LAYERS))
        self.down = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, 4, bias=False) for _ in range(LAYERS))
        self.up = torch.nn.ModuleList(torch.nn.Linear(4, HIDDEN, bias=False) for _ in range(LAYERS))
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, 8)
        for p in self.layers.parameters():
            p.requires_grad_(False)
        self.norm.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, down, up in zip(self.layers, self.down, self.up, strict=True):
            x = torch.relu(layer(x) + up(down(x)))
        return self.head(self.norm(x))


def _layer(kind: str) -> torch.nn.Module:
    if kind == "int8":
        return bnb.nn.Linear8bitLt(HIDDEN, HIDDEN, has_fp16_weights=False).to("cpu")
    layer = bnb.nn.Linear4bit(
        HIDDEN, HIDDEN, compute_dtype=torch.float32, quant_type=kind, compress_statistics=kind == "nf4"
    )
    return layer.to("cpu")  # quantizes the weight


def _quant_state_tensors(layer: torch.nn.Module, p: torch.Tensor) -> list[torch.Tensor]:
    """The test's own reading of bitsandbytes' state: QuantState's absmax, code, offset and, with double
    quantization, state2's absmax and code; Int8Params' row scales SCB (its CB is the weight itself), which
    the layer's first forward moves to ``layer.state``."""
    out = []
    state = getattr(layer, "state", None)
    if getattr(state, "SCB", None) is not None and p is layer.weight:
        out.append(state.SCB)
        assert state.CB.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
    qs = getattr(p, "quant_state", None)
    if qs is not None:
        out += [qs.absmax, qs.code]
        if qs.offset is not None:
            out.append(qs.offset)
        if qs.state2 is not None:
            out += [qs.state2.absmax, qs.state2.code]
    if getattr(p, "SCB", None) is not None:
        out.append(p.SCB)
        assert p.CB.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
    return out


def _run(
    kind: str, hooked: bool, count_states: Callable[[torch.optim.Optimizer], int] | None = None
) -> tuple[list[float], _Quantized, anatomy.Tracker | None, list[int]]:
    """(losses, model, tracker, the optimizer's state bytes after each update by ``count_states``)."""
    model = _Quantized(kind)
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
    plain, _, _, _ = _run(kind, hooked=False)
    losses, model, tracker, states = _run(kind, hooked=True, count_states=st.state_bytes)
    assert tracker is not None
    assert losses == plain  # bit-identical
    assert losses[-1] < losses[0]  # the adapters train through the quantized layers

    logical = 0
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        logical += int(torch.Size(qs.shape).numel()) if qs is not None else p.numel()
    quantized = [p for layer in model.layers for p in layer.parameters()]
    packed = [p for p in quantized if getattr(p, "quant_state", None) is not None]
    if kind != "int8":  # two 4-bit weights per uint8 element: the packed count would be far off
        assert sum(p.numel() for p in packed) * 2 == sum(
            int(torch.Size(p.quant_state.shape).numel()) for p in packed
        )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    seen: set[int] = set()
    weights = state_bytes = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            weights += t.untyped_storage().nbytes()
    for layer in model.layers:
        for t in (t for p in layer.parameters() for t in _quant_state_tensors(layer, p)):
            if t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                state_bytes += t.untyped_storage().nbytes()
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
    assert snap.memory[Component.WEIGHTS.value] == weights + state_bytes
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
