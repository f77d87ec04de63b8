"""A quantized frozen base (QLoRA, ``--quant``): which layers bitsandbytes holds, and in how many bytes.

The layers are the ones transformers quantizes when a model is loaded with a ``BitsAndBytesConfig``:
every ``nn.Linear`` (and GPT-2's ``Conv1D``) except the output embeddings and the model's
``_keep_in_fp32_modules`` (``replace_with_bnb_linear``, with the same skip list).

Bytes follow bitsandbytes' own layout (``bitsandbytes.functional.quantize_4bit``), tensor by tensor,
so that the planned weights are what ``Linear4bit`` allocates:

* 4-bit (nf4 / fp4): the packed weight, two values a byte, ``(n + 1) // 2`` bytes; one absmax per
  block of 64 values; the 16-entry float32 code of the 4-bit type (one per layer). With nested
  ("double") quantization the absmaxes are themselves quantized: one uint8 per block, a float32
  absmax per 256 of them, a 0-dim float32 offset, and a copy of the 256-entry float32 "dynamic" map
  (``quantize_blockwise`` stores ``code.to(device, copy=True)``: one per layer). Without it: one
  float32 absmax per block.
* int8 (``Linear8bitLt``, LLM.int8()): one int8 per value and one float32 scale per output row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anatomy.plan.settings import Target
from anatomy.plan.states import allocation_bytes

QUANT_TYPES: tuple[str, ...] = ("nf4", "fp4", "int8")
BLOCKSIZE_4BIT = 64  # bitsandbytes' default for quantize_4bit (Params4bit blocksize=None)
NESTED_BLOCKSIZE = 256  # quantize_blockwise of the absmaxes
CODE_4BIT_BYTES = 16 * 4  # get_4bit_type(): 16 float32 values, a new tensor per quantized layer
DYNAMIC_MAP_BYTES = 256 * 4  # the nested state's copy of name2qmap["dynamic"], one per layer
COMPUTE_DTYPE = "bfloat16"  # bnb_4bit_compute_dtype of the QLoRA recipe
COMPUTE_DTYPE_SIZE = 2


@dataclass(frozen=True)
class QuantSpec:
    """How the frozen base is quantized."""

    quant_type: str  # nf4 | fp4 | int8
    double_quant: bool = True  # nested quantization of the 4-bit absmaxes (QLoRA)

    @property
    def four_bit(self) -> bool:
        return self.quant_type in ("nf4", "fp4")


def weight_tensor_bytes(numel: int, out_features: int, spec: QuantSpec) -> list[int]:
    """The tensors one quantized weight of ``numel`` values is stored in (bytes each)."""
    if not spec.four_bit:
        return [numel, out_features * 4]  # int8 CB, float32 SCB
    blocks = -(-numel // BLOCKSIZE_4BIT)
    tensors = [(numel + 1) // 2, CODE_4BIT_BYTES]
    if spec.double_quant:
        nested = -(-blocks // NESTED_BLOCKSIZE)
        # uint8 absmaxes, their float32 absmaxes, the offset, the nested state's dynamic map
        tensors += [blocks, nested * 4, 4, DYNAMIC_MAP_BYTES]
    else:
        tensors.append(blocks * 4)
    return tensors


def quantized_weights_bytes(shapes: list[tuple[int, int]], spec: QuantSpec, target: Target) -> int:
    """Bytes of the quantized weights of layers of (out_features, in_features), on the target."""
    return sum(
        allocation_bytes(b, target) for out, inp in shapes for b in weight_tensor_bytes(out * inp, out, spec)
    )


def skipped_modules(model: Any) -> list[str]:
    """What transformers leaves unquantized: the output embeddings (and what ties to them) and the
    model's ``_keep_in_fp32_modules``."""
    from transformers.quantizers.base import get_keys_to_not_convert

    skip = list(get_keys_to_not_convert(model))
    skip += list(getattr(model, "_keep_in_fp32_modules", None) or [])
    return sorted(set(skip))


def quantized_linears(model: Any) -> list[tuple[str, Any]]:
    """(name, module) of every layer a BitsAndBytesConfig load quantizes."""
    import torch
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = skipped_modules(model)
    return [
        (name, module)
        for name, module in model.named_modules()
        if (type(module) is torch.nn.Linear or isinstance(module, Conv1D))
        and should_convert_module(name, skip)
    ]


def linear_shape(module: Any) -> tuple[int, int]:
    """(out_features, in_features) of an nn.Linear or a Conv1D (whose weight is stored transposed)."""
    import torch

    if type(module) is torch.nn.Linear:
        return module.out_features, module.in_features
    rows, cols = module.weight.shape  # Conv1D: (in, out)
    return int(cols), int(rows)


def quantize(model: Any, spec: QuantSpec) -> list[Any]:
    """Replace the layers a BitsAndBytesConfig load quantizes by bitsandbytes' modules holding the
    quantized weights, as transformers does (on fake tensors in the plan: bitsandbytes' kernels have
    fake implementations). Returns the tensors of the quantization states, which are neither
    parameters nor buffers but are memory the weights take."""
    import bitsandbytes as bnb
    import torch

    dtype = getattr(torch, COMPUTE_DTYPE)
    states: list[Any] = []
    # bitsandbytes caches the dynamic map nested quantization uses in a module-level dict: made here,
    # it would be a fake tensor that a later real quantization in this process picks up.
    cache = bnb.functional.name2qmap
    cached = dict(cache)
    try:
        _quantize_layers(model, spec, dtype, states)
    finally:
        cache.clear()
        cache.update(cached)
    return states


def _quantize_layers(model: Any, spec: QuantSpec, dtype: Any, states: list[Any]) -> None:
    import bitsandbytes as bnb
    import torch
    from transformers.pytorch_utils import Conv1D

    for name, module in quantized_linears(model):
        out, inp = linear_shape(module)
        value = module.weight.detach()
        if isinstance(module, Conv1D):
            value = value.T
        bias = module.bias is not None
        new: Any
        if spec.four_bit:
            with _outside_fake_mode():  # the module's own placeholder weight is replaced below
                new = bnb.nn.Linear4bit(
                    inp,
                    out,
                    bias,
                    dtype,
                    compress_statistics=spec.double_quant,
                    quant_type=spec.quant_type,
                    quant_storage=torch.uint8,
                    device="meta",
                )
            packed, state = bnb.functional.quantize_4bit(
                value.contiguous(),
                compress_statistics=spec.double_quant,
                quant_type=spec.quant_type,
                quant_storage=torch.uint8,
            )
            # What Params4bit holds after quantization, on a plain parameter: a Params4bit cannot wrap
            # a fake tensor, and Linear4bit and PEFT read only these attributes of their weight.
            weight = torch.nn.Parameter(packed, requires_grad=False)
            for attr, val in (
                ("quant_state", state),
                ("compress_statistics", spec.double_quant),
                ("quant_type", spec.quant_type),
                ("blocksize", state.blocksize),
                ("quant_storage", torch.uint8),
                ("bnb_quantized", True),
                ("module", new),
            ):
                setattr(weight, attr, val)
            new.quant_state = state
            states += quant_state_tensors(state)
        else:
            with _outside_fake_mode():
                new = bnb.nn.Linear8bitLt(
                    inp, out, bias, has_fp16_weights=False, threshold=6.0, device="meta"
                )
            cb, scb, _ = bnb.functional.int8_vectorwise_quant(value.contiguous().to(torch.float16))
            weight = torch.nn.Parameter(cb, requires_grad=False)
            for attr, val in (("CB", cb), ("SCB", scb), ("has_fp16_weights", False)):
                setattr(weight, attr, val)
            new.state.CB, new.state.SCB = cb, scb
            states.append(scb)
        new._parameters["weight"] = weight
        if bias:
            new._parameters["bias"] = torch.nn.Parameter(module.bias.detach(), requires_grad=False)
        new.requires_grad_(False)
        model.set_submodule(name, new)


def _outside_fake_mode() -> Any:
    """bitsandbytes' modules wrap their placeholder weight in a tensor subclass, which cannot wrap a
    fake tensor: they are built on the real meta device, and their weights replaced by fake ones."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def quant_state_tensors(state: Any) -> list[Any]:
    """The tensors of a bitsandbytes QuantState (nested state included)."""
    import torch

    found = []
    for attr in ("absmax", "code", "offset"):
        value = getattr(state, attr, None)
        if isinstance(value, torch.Tensor):
            found.append(value)
    nested = getattr(state, "state2", None)
    if nested is not None:
        found += quant_state_tensors(nested)
    return found
