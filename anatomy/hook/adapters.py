"""The LoRA adapter a PEFT model trains, for the hello (what `anatomy-top plan --like` plans with).

Read duck-typed from ``model.peft_config`` — a dict of adapter name to config that PEFT's ``PeftModel``,
its LoRA tuner and a transformers model given adapters with ``add_adapter`` all carry — so peft is never
imported here. Read when a hello is built (at start and on a set-up change), never on a step.
"""

from __future__ import annotations

from typing import Any

import torch

from anatomy.protocol import MAX_LORA_RANK, MAX_LORA_TARGETS, MAX_MODEL_NAME, LoraAdapter


def lora_adapter(model: torch.nn.Module) -> LoraAdapter | None:
    """The active LoRA adapter of ``model`` (seen through DDP's wrapper); None for a model without one,
    another PEFT method, or an adapter the hello cannot carry (over its bounds)."""
    try:
        return _lora_adapter(model)
    except Exception:  # a model whose attributes fail to read: the hello goes without it
        return None


def _lora_adapter(model: torch.nn.Module) -> LoraAdapter | None:
    inner = getattr(model, "module", None)  # DDP's wrapper
    if type(model).__name__ == "DistributedDataParallel" and isinstance(inner, torch.nn.Module):
        model = inner
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return None
    config = configs.get(_active_name(model, configs))
    peft_type = getattr(config, "peft_type", None)
    if getattr(peft_type, "value", peft_type) != "LORA":
        return None
    rank = getattr(config, "r", None)
    dropout = getattr(config, "lora_dropout", 0.0)
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_LORA_RANK:
        return None
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0.0 <= dropout < 1.0:
        return None
    targets = _target_names(model, getattr(config, "target_modules", None))
    if not targets or len(targets) > MAX_LORA_TARGETS:
        return None
    return LoraAdapter(
        rank=rank,
        target_modules=targets,
        dropout=float(dropout),
        base_model_class=_base_class(model)[:MAX_MODEL_NAME],
    )


def _active_name(model: torch.nn.Module, configs: dict[Any, Any]) -> Any:
    active = getattr(model, "active_adapter", None)  # PeftModel: a name (transformers: a method)
    if isinstance(active, str) and active in configs:
        return active
    return "default" if "default" in configs else next(iter(configs))


def _target_names(model: torch.nn.Module, targets: Any) -> tuple[str, ...]:
    """The last name component of each target (PEFT matches a name on the module name's end, and
    resolves "all-linear" into every linear layer's full name: one name per kind of layer, however deep
    the model); for a regular expression, of every module that holds LoRA weights."""
    if isinstance(targets, (list, tuple, set, frozenset)):
        names = {t.rsplit(".", 1)[-1] for t in targets if isinstance(t, str)}
    else:
        names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if hasattr(m, "lora_A")}
    return tuple(sorted(n for n in names if 0 < len(n) <= MAX_MODEL_NAME))


def _base_class(model: torch.nn.Module) -> str:
    """The transformers model inside PEFT's wrapper (``get_base_model``); the model itself otherwise."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    name = type(base if isinstance(base, torch.nn.Module) else model).__name__
    if name.startswith("FSDP"):  # fully_shard's generated FSDP<Name> class
        name = name[4:]
    return name
