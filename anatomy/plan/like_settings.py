"""What `anatomy-top plan --like PID` plans: the settings of a running job, read from its hook's hello and
latest snapshot.

The hello carries the Hugging Face config, the first forward's input shape and (when passed by keyword)
its labels' shape, the precision, the optimizer, the device, the world size under torchrun, the weights'
bitsandbytes format and a PEFT model's LoRA adapter. Each task reads the first input as its data
collator builds it: token ids (batch, tokens); images (batch, channels, height, width); a speech
encoder's log-mel features (batch, mel bins, frames), 100 frames a second. An encoder-decoder's target
length is its labels' length; a hook that did not see labels leaves it to ``--target-len``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from anatomy.plan.settings import (
    OPTIMIZER_KINDS,
    PLANNED_PRECISIONS,
    QUANT_TYPES,
    PlanError,
    PlanSettings,
    Target,
    Task,
)
from anatomy.plan.workload import FRAMES_PER_SECOND
from anatomy.units import fmt_bytes
from anatomy.vocabulary import Component, Precision

if TYPE_CHECKING:
    from anatomy.plan.like import Measured
    from anatomy.protocol import Hello


def settings_like(measured: Measured, base: PlanSettings) -> tuple[Any, PlanSettings]:
    """The config and the settings of the process's job (``base``: the command line's other options,
    which fill what the hello does not say)."""
    hello, snap = measured.hello, measured.snapshot
    if not hello.model_config:
        raise PlanError(
            f"process {hello.pid} ({hello.model_class}) published no Hugging Face config: "
            "only transformers models can be planned"
        )
    if not hello.batch_shape:
        raise PlanError(f"process {hello.pid} has not run a forward yet (no batch shape)")
    try:
        precision = Precision(hello.precision)
    except ValueError:
        precision = Precision.FP32
    if precision not in PLANNED_PRECISIONS:
        raise PlanError(f"process {hello.pid} trains in {hello.precision}, which is not planned")
    optimizer = next((k for k, v in OPTIMIZER_KINDS.items() if v.value == hello.optimizer), None)
    if optimizer is None:
        raise PlanError(
            f"process {hello.pid}'s optimizer ({hello.optimizer_class or hello.optimizer}) is not planned"
        )
    from transformers import AutoConfig

    from anatomy.plan.config import default_task

    data = json.loads(hello.model_config)
    model_type = data.pop("model_type", None)
    # The config of a model loaded quantized says how (the hello's weight_quantization says it too); the
    # plan's model is quantized by the settings, never by the config.
    data.pop("quantization_config", None)
    if not isinstance(model_type, str):
        raise PlanError(f"process {hello.pid}'s config names no model_type")
    config = AutoConfig.for_model(model_type, **data)
    config.architectures = [trained_class(hello)]  # the head it trains
    task = base.task or default_task(config)
    world = hello.world_size or 1
    fsdp: tuple[int, ...] = ()
    ddp: tuple[int, ...] = ()
    if world > 1 and snap.memory.get(Component.UNSHARDED_PARAMETERS) is not None:
        fsdp = (world,)
    elif world > 1 and snap.memory.get(Component.COMMUNICATION_BUFFERS) is not None:
        ddp = (world,)
    settings = replace(
        base,
        **shape_settings(hello, task, base),
        **adapter_settings(hello, base),
        task=task,
        batch_size=hello.batch_shape[0],
        precision=precision,
        optimizer=optimizer,
        target=Target.CPU if hello.device == "cpu" else Target.CUDA,
        padded=base.padded if base.padded is not None else False,  # the hook saw no mask: plan none
        fsdp=fsdp,
        ddp=ddp,
    )
    return config, settings


def trained_class(hello: Hello) -> str:
    """The transformers class the process trains (a PEFT model's base: the hello names PEFT's wrapper)."""
    if hello.lora is not None and hello.lora.base_model_class:
        return hello.lora.base_model_class
    return hello.model_class


def shape_settings(hello: Hello, task: Task, base: PlanSettings) -> dict[str, Any]:
    """The micro-batch's sizes from the first input's shape (and its labels', for a target length)."""
    shape = hello.batch_shape or ()
    pid = hello.pid
    if task is Task.IMAGE_CLASSIFICATION:
        if len(shape) != 4:
            raise PlanError(f"process {pid}'s first input {shape} is not a batch of images (B, C, H, W)")
        return {"seq_len": None, "image_size": shape[2]}
    if len(shape) < 2:
        raise PlanError(f"process {pid}'s first input {shape} has no sequence dimension")
    target = target_len(hello)
    if task is Task.SPEECH_SEQ2SEQ:
        if len(shape) != 3:
            raise PlanError(
                f"process {pid}'s first input {shape} is not log-mel features (batch, mel bins, frames)"
            )
        return {
            "seq_len": None,
            "audio_seconds": shape[2] / FRAMES_PER_SECOND,
            "target_len": target or base.target_len,
        }
    if task is Task.SEQ2SEQ_LM:
        return {"seq_len": shape[1], "target_len": target or base.target_len}
    return {"seq_len": shape[1]}


def target_len(hello: Hello) -> int | None:
    """The labels' length of the first forward, when the hook saw them passed by keyword."""
    shape = hello.target_shape
    return shape[1] if shape is not None and len(shape) >= 2 and shape[1] >= 1 else None


def adapter_settings(hello: Hello, base: PlanSettings) -> dict[str, Any]:
    """LoRA from the hello's adapter, the quantized base from its weight format; without them, the
    command line's (``--lora``, ``--qlora``, ``--quant``: a hook too old to say)."""
    out: dict[str, Any] = {}
    lora = hello.lora
    if lora is not None:
        out.update(lora_rank=lora.rank, lora_targets=lora.target_modules, lora_dropout=lora.dropout)
    quant = hello.weight_quantization
    if quant is not None and quant in QUANT_TYPES:
        out["quant"] = quant
    return out


def like_notes(hello: Hello, settings: PlanSettings, trainable_planned: int, outputs_kept: int) -> list[str]:
    """What the plan read from the hello beyond the plain settings, and what it could not."""
    notes: list[str] = []
    if outputs_kept > 0:
        notes.append(
            f"a plain loop's `out` still holds the previous step's outputs ({fmt_bytes(outputs_kept)} by the "
            "plan: logits, KV cache) when a step starts; the hook counts them as unattributed through the "
            "whole step although the forward frees them, so its peak (tensors) can read up to that much "
            "low (a loop that keeps only the loss, as the Trainer does, has no such gap: --loop trainer)"
        )
    if settings.task is Task.SPEECH_SEQ2SEQ and settings.audio_seconds is not None:
        frames = round(settings.audio_seconds * FRAMES_PER_SECOND)
        notes.append(
            f"speech: {settings.audio_seconds:g} s of audio from the first batch's {frames} feature "
            f"frames ({FRAMES_PER_SECOND} a second)"
        )
    if settings.task in (Task.SEQ2SEQ_LM, Task.SPEECH_SEQ2SEQ):
        if target_len(hello) is not None:
            notes.append(f"target length {settings.target_len}: the first batch's labels")
        elif settings.target_len is None:
            default = "the source length" if settings.task is Task.SEQ2SEQ_LM else "128 tokens"
            notes.append(
                f"target length unknown (the hook saw no labels passed by keyword): planned at {default}; "
                "--target-len N sets it"
            )
    if hello.lora is not None:
        notes.append(
            f"LoRA from the process's PEFT adapter: rank {hello.lora.rank} on "
            f"{', '.join(hello.lora.target_modules)}, dropout {hello.lora.dropout:g}"
        )
    if hello.weight_quantization is not None:
        notes.append(
            f"base quantized by bitsandbytes ({hello.weight_quantization}); a 4-bit base is planned with "
            "double quantization and bfloat16 compute, as the QLoRA recipe loads it"
        )
    trained = hello.trainable_parameter_count
    if trained is not None and trained != trainable_planned:
        notes.append(
            f"the process trains {trained:,} parameters, the plan {trainable_planned:,}: the job trains "
            "something the plan does not model (PEFT's modules_to_save, layers_to_transform, rank_pattern, "
            "DoRA, or parameters frozen by hand), so gradients and optimizer states differ"
        )
    return notes
