"""Parameter-efficient fine-tuning: the model a LoRA or QLoRA run trains, built as PEFT builds it.

``adapt`` turns the model built from the config into the one the user's script trains: the base
quantized by bitsandbytes (``--quant``, or ``--qlora``: nf4 with double quantization and bfloat16
compute, as the QLoRA recipe loads it; ``anatomy.plan.quant``), then wrapped by PEFT's
``get_peft_model`` with a ``LoraConfig`` of the requested rank, target modules and dropout. The
wrapped model is the real one — PEFT's own LoRA layers on the real (fake-tensor) base — so what it
saves for backward (the dropout's output and mask when ``lora_dropout > 0``, the rank-r
intermediate) is the library's, not a formula. PEFT freezes the base: only the adapters have
gradients and optimizer states.

Default target modules are PEFT's for the architecture
(``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``: q_proj/v_proj on Llama, c_attn on GPT-2,
q/v on T5, ...); an architecture PEFT has no default for needs ``--lora-targets``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from anatomy.plan.quant import (
    COMPUTE_DTYPE_SIZE,
    QuantSpec,
    linear_shape,
    quantize,
    quantized_linears,
    quantized_weights_bytes,
)
from anatomy.plan.settings import PlanError, PlanSettings, Target
from anatomy.plan.states import allocation_bytes

DEFAULT_QLORA_RANK = 8


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    targets: tuple[str, ...] | None  # None: PEFT's defaults for the architecture
    dropout: float


def lora_spec(settings: PlanSettings) -> LoraSpec | None:
    if settings.lora_rank is None:
        return None
    return LoraSpec(settings.lora_rank, settings.lora_targets, settings.lora_dropout)


def quant_spec(settings: PlanSettings) -> QuantSpec | None:
    return QuantSpec(settings.quant) if settings.quant else None


def adapter_key(settings: PlanSettings) -> tuple[Any, ...]:
    """What of the settings changes the model trained (part of a profile's cache key)."""
    return (lora_spec(settings), quant_spec(settings))


def default_targets(config: Any) -> tuple[str, ...]:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as MAPPING

    model_type = getattr(config, "model_type", "")
    targets = MAPPING.get(model_type)
    if not targets:
        raise PlanError(
            f"PEFT has no default LoRA target modules for {model_type or type(config).__name__}: "
            "pass --lora-targets (e.g. q_proj,v_proj)"
        )
    return tuple(targets)


def _leaf_names(model: Any) -> dict[str, str]:
    """Last name component -> module class, of every module (what a target name matches)."""
    return {name.rsplit(".", 1)[-1]: type(m).__name__ for name, m in model.named_modules() if name}


def check_targets(model: Any, targets: tuple[str, ...]) -> None:
    """Every target names a module of the model (PEFT matches a target on the module name's end)."""
    names = _leaf_names(model)
    missing = [t for t in targets if t not in names and not any(n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted(n for n, cls in names.items() if cls in ("Linear", "Conv1D") and not n.isdigit())
        raise PlanError(
            f"--lora-targets: {', '.join(missing)} is not a module of {type(model).__name__} "
            f"(its linear layers: {', '.join(linear[:12])})"
        )


def adapt(model: Any, config: Any, settings: PlanSettings) -> tuple[Any, list[Any]]:
    """The model the run trains, and the quantization states' tensors (memory that is neither a
    parameter nor a buffer). Without LoRA or quantization: ``model`` itself."""
    lora, quant = lora_spec(settings), quant_spec(settings)
    states: list[Any] = []
    if quant is not None:
        states = quantize(model, quant)
        # As transformers marks a model it loaded quantized: PEFT then wraps the bnb layers with its
        # bnb LoRA layers.
        model.is_loaded_in_4bit = quant.four_bit
        model.is_loaded_in_8bit = not quant.four_bit
    if lora is None:
        return model, states
    from peft import LoraConfig, get_peft_model

    targets = lora.targets or default_targets(config)
    check_targets(model, targets)
    peft_config = LoraConfig(r=lora.rank, target_modules=list(targets), lora_dropout=lora.dropout)
    with _adapters_in_place():
        return get_peft_model(model, peft_config), states


@contextlib.contextmanager
def _adapters_in_place() -> Iterator[None]:
    """PEFT moves each new adapter (and each wrapped layer) to its base layer's device and dtype with
    ``Module.to``, which on fake tensors swaps parameters and fails even when nothing moves. In the
    plan the adapters are created on the base's device (fake CPU, or meta) already; a ``to`` that
    would change nothing is skipped while they are made, and so is a cast to half precision (PEFT
    casts new adapters to a quantized layer's compute dtype, and get_peft_model's
    ``autocast_adapter_dtype`` casts them back to float32: they end as they began)."""
    import torch

    original = torch.nn.Module.to
    half = (torch.float16, torch.bfloat16)

    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        tensors = [*self.parameters(), *self.buffers()]
        if all(
            (device is None or t.device == device)
            and (dtype is None or not t.is_floating_point() or t.dtype == dtype or dtype in half)
            for t in tensors
        ):
            return self
        return original(self, *args, **kwargs)

    torch.nn.Module.to = to  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.nn.Module.to = original  # type: ignore[method-assign]


def quantized_weight_adjustment(model: Any, settings: PlanSettings, target: Target) -> tuple[int, int]:
    """For states taken from the unquantized model: (bytes to remove: the full-precision weights of
    the layers bitsandbytes holds, bytes to add: bitsandbytes' layout of them on the target)."""
    quant = quant_spec(settings)
    if quant is None:
        return 0, 0
    layers = [m for _, m in quantized_linears(model)]
    removed = sum(m.weight.numel() * m.weight.element_size() for m in layers)
    added = quantized_weights_bytes([linear_shape(m) for m in layers], quant, target)
    # Linear4bit's forward casts its bias to the compute dtype, in place (``bias.data = ...``): from
    # the first step on, the bias is bfloat16.
    biases = [m.bias for m in layers if m.bias is not None]
    if quant.four_bit:
        removed += sum(b.numel() * b.element_size() for b in biases)
        added += sum(allocation_bytes(b.numel() * COMPUTE_DTYPE_SIZE, target) for b in biases)
    return removed, added


def adapted_states(config: Any, task: Any, settings: PlanSettings, name: str) -> Any:
    """Model states of the adapted model, from the model built on the meta device: LoRA adapters
    trainable, the base frozen, and the quantized layers' weights in bitsandbytes' layout."""
    from dataclasses import replace

    import torch

    from anatomy.plan.model import build_model
    from anatomy.plan.quiet import warnings_off
    from anatomy.plan.states import model_states

    try:
        with torch.device("meta"), warnings_off():
            model = build_model(config, task)
            base_class = type(model).__name__
            removed, added = quantized_weight_adjustment(model, settings, Target.CPU)
            _, added_cuda = quantized_weight_adjustment(model, settings, Target.CUDA)
            layers = quantized_linears(model) if settings.quant else []
            quantized = {id(m.weight) for _, m in layers} | {id(m.bias) for _, m in layers}
            for _, layer in layers:  # bitsandbytes' layers are frozen (the rest trains without LoRA)
                layer.requires_grad_(False)
            model, _ = adapt(model, config, replace(settings, quant=None))
    except PlanError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise PlanError(f"could not build {name} with adapters: {type(exc).__name__}: {first}") from None
    states = model_states(model, config)
    frozen = [t for t in [*model.parameters(), *model.buffers()] if not t.requires_grad]
    slack = sum(
        allocation_bytes(t.numel() * t.element_size(), Target.CUDA) - t.numel() * t.element_size()
        for t in {id(t): t for t in frozen}.values()
        if id(t) not in quantized
    )
    return replace(
        states,
        model_class=base_class + (" + LoRA" if settings.lora_rank is not None else ""),
        param_bytes=states.param_bytes - removed + added,
        frozen_slack_cuda=slack + added_cuda - added,
    )


def adapter_notes(settings: PlanSettings) -> list[str]:
    lora, quant = lora_spec(settings), quant_spec(settings)
    notes = []
    if quant is not None:
        layout = (
            "4-bit packed weights, an absmax per 64 values"
            + (" quantized again per 256 (double quantization)" if quant.double_quant else "")
            + ", bfloat16 compute"
            if quant.four_bit
            else "int8 weights and a float32 scale per row (LLM.int8())"
        )
        notes.append(
            f"frozen base quantized by bitsandbytes ({quant.quant_type}): every linear layer but the "
            f"output embeddings, {layout}; the other modules in their own dtype"
        )
    if lora is not None:
        targets = ", ".join(lora.targets) if lora.targets else "PEFT's defaults for the architecture"
        notes.append(
            f"LoRA rank {lora.rank} on {targets}, dropout {lora.dropout:g} (PEFT): gradients and "
            "optimizer states for the adapters only"
        )
    return notes
