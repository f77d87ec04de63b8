"""The hello: what a monitor learns once about the process (model, device, precision, optimizer)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

import torch

from anatomy.hook.adapters import lora_adapter
from anatomy.hook.detect import detect_optimizer
from anatomy.hook.guard import Feature, Guard
from anatomy.hook.tensors import dominant_dtype, dtype_name, parameter_count
from anatomy.protocol import MAX_BATCH_DIMS, MAX_CONFIG_CHARS, MAX_OTHER_MODELS, Hello
from anatomy.vocabulary import Precision


def env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def build_hello(
    model: torch.nn.Module,
    optimizer: Any,
    *,
    device: torch.device | None,
    is_cuda: bool,
    precision: Precision,
    started_at: float,
    guard: Guard,
    trainable: int | None = None,
    quantization: str | None = None,
    others: dict[str, int] | None = None,
    batch_shape: tuple[int, ...] | None = None,
    target_shape: tuple[int, ...] | None = None,
) -> Hello:
    """``trainable``, ``quantization`` and ``others`` as the tracker last summed them (the trainable count,
    the weights' bitsandbytes format, each other model's bytes); ``batch_shape`` and ``target_shape`` as
    the first forward gave them (:func:`target_shape`)."""
    count, dtype = 0, "float32"
    with guard(Feature.DEVICE):
        count, dtype = parameter_count(model), dtype_name(dominant_dtype(model))
    return Hello(
        pid=os.getpid(),
        host=socket.gethostname(),
        device=str(device) if device is not None else "cpu",
        precision=precision,
        optimizer=detect_optimizer(optimizer),
        model_class=model_class_name(model),
        parameter_count=count,
        torch_version=torch.__version__,
        started_at=started_at,
        rank=env_int("RANK"),
        local_rank=env_int("LOCAL_RANK"),
        world_size=env_int("WORLD_SIZE"),
        run_id=_run_id(),
        local_world_size=env_int("LOCAL_WORLD_SIZE"),
        dtype=dtype,
        optimizer_class=type(optimizer).__name__ if optimizer is not None else "",
        trainable_parameter_count=trainable,
        weight_quantization=quantization,
        # the protocol's limit: the component's figure still sums them all
        other_models=dict(list(others.items())[:MAX_OTHER_MODELS]) if others is not None else None,
        batch_shape=_bounded(batch_shape),
        model_config=model_config_json(model),
        target_shape=_bounded(target_shape),
        lora=lora_adapter(model),
        **_device_facts(model, device if is_cuda else None, guard),
    )


TARGET_KEYS = ("labels", "decoder_input_ids")


def target_shape(kwargs: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The shape of the forward's ``labels`` (else ``decoder_input_ids``) passed by keyword, as a Trainer
    and a seq2seq collator pass them: an encoder-decoder's target length, which its first input does not
    tell. Read on the first forward only."""
    for key in TARGET_KEYS:
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor):
            return tuple(int(n) for n in value.shape)
    return None


def _bounded(shape: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """A shape the protocol carries (at most MAX_BATCH_DIMS dimensions); None for a longer one."""
    return shape if shape is not None and len(shape) <= MAX_BATCH_DIMS else None


def model_config_json(model: torch.nn.Module) -> str | None:
    """The Hugging Face config (its diff from the defaults, as `save_pretrained` writes it) as JSON, for
    `anatomy-top plan --like`; None for a model without one, or one beyond the protocol's bound."""
    inner = getattr(model, "module", None)  # DDP's wrapper
    config = getattr(inner if isinstance(inner, torch.nn.Module) else model, "config", None)
    to_json = getattr(config, "to_json_string", None)
    if not callable(to_json):
        return None
    try:
        text = to_json(use_diff=True)
    except Exception:  # a config that cannot serialize itself: the hello goes without it
        return None
    return text if isinstance(text, str) and len(text) <= MAX_CONFIG_CHARS else None


def _run_id() -> str | None:
    """The launcher's job id, shared by every rank of one job (torchrun sets TORCHELASTIC_RUN_ID; its
    default ``none`` without ``--rdzv-id`` is shared by unrelated jobs, so it is not an id)."""
    value = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    return value[:128] if value and value != "none" else None


def model_class_name(model: torch.nn.Module) -> str:
    """The user's model class, seen through DDP's wrapper and FSDP2's generated ``FSDP<Name>`` class."""
    inner = getattr(model, "module", None)
    if type(model).__name__ == "DistributedDataParallel" and isinstance(inner, torch.nn.Module):
        model = inner
    name = type(model).__name__
    if name.startswith("FSDP"):  # fully_shard makes class FSDP<Name>(FSDPModule, <Name>)
        for base in type(model).__mro__[1:]:
            if "FSDP" + base.__name__ == name:
                return base.__name__
    return name


def _device_facts(model: torch.nn.Module, cuda_device: torch.device | None, guard: Guard) -> dict[str, Any]:
    """The optional hello fields the advisor uses (GPU name and memory, TF32, vocabulary)."""
    facts: dict[str, Any] = {}
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
        facts["vocab_size"] = vocab
    if cuda_device is not None and guard.ok(Feature.DEVICE):
        with guard(Feature.DEVICE):
            props = torch.cuda.get_device_properties(cuda_device)
            facts["device_name"] = str(props.name)
            facts["device_memory_bytes"] = int(props.total_memory)
            facts["tf32"] = bool(
                torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
            )
    return facts
