"""Pre-flight anatomy: predict a training step's memory before running it (`anatomy-top plan`).

The package, by responsibility (each module's docstring says more):

* ``settings``  — what is asked (PlanSettings, Task, Target) and the checks needing no model; stdlib only
* ``config``    — loading a transformers config, its default task, its layer stacks and position limit
* ``workload``  — the settings resolved against a config: one micro-batch's shapes, padding, KV cache
* ``model``     — building the model and its inputs (shared with the tests' real runs)
* ``peft_model`` — LoRA / QLoRA: the PEFT-wrapped (and bitsandbytes-quantized) model a run trains
* ``quant``     — which layers bitsandbytes quantizes, and its 4-bit / int8 layout in bytes
* ``moe``       — mixture-of-experts: the experts' grouped matmul on fake tensors, routing
* ``states``    — weights, gradients, optimizer states and step temporaries from shapes
* ``timeline``  — the allocation timeline of a fake step and its replay into phase peaks
* ``kernels``   — CUDA kernels' memory on fake CPU tensors (dropout masks, fused attention, autocast)
* ``profile``   — the fake forward + backward: a StepProfile
* ``quiet``     — transformers' log and Python's warnings off while the plan builds a model; stdlib only
* ``depth``     — deep models from shallow runs (linear in each stack's depth)
* ``planner``   — Planner: states + profile -> PlanResult (``result``), GPU from ``gpu``
* ``search``    — the technique table, the best combination, the largest batch that fits

Importing ``anatomy.plan`` is cheap: names are loaded from their modules (and torch with them) on
first use, so the CLI can validate its arguments before torch is imported.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "PlanError": "settings",
    "PlanSettings": "settings",
    "Task": "settings",
    "Target": "settings",
    "OPTIMIZERS": "settings",
    "check_settings": "settings",
    "load_config": "config",
    "default_task": "config",
    "layer_period": "config",
    "depth_axes": "config",
    "Workload": "workload",
    "build_model": "model",
    "enable_checkpointing": "model",
    "make_inputs": "model",
    "prepare_config": "model",
    "ModelStates": "states",
    "model_states": "states",
    "optimizer_state_bytes": "states",
    "optimizer_step_temporary_bytes": "states",
    "StepProfile": "profile",
    "run_step_profile": "profile",
    "PlanResult": "result",
    "GpuMemory": "gpu",
    "resolve_gpu": "gpu",
    "nvml_gpu": "gpu",
    "Planner": "planner",
    "plan": "planner",
    "ALLOCATOR_HEADROOM": "planner",
    "TechniqueRow": "search",
    "BatchSearch": "search",
    "technique_table": "search",
    "best_combination": "search",
    "largest_batch": "search",
}

__all__ = [
    "ALLOCATOR_HEADROOM",
    "OPTIMIZERS",
    "BatchSearch",
    "GpuMemory",
    "ModelStates",
    "PlanError",
    "PlanResult",
    "PlanSettings",
    "Planner",
    "StepProfile",
    "Target",
    "Task",
    "TechniqueRow",
    "Workload",
    "best_combination",
    "build_model",
    "check_settings",
    "default_task",
    "depth_axes",
    "enable_checkpointing",
    "largest_batch",
    "layer_period",
    "load_config",
    "make_inputs",
    "model_states",
    "nvml_gpu",
    "optimizer_state_bytes",
    "optimizer_step_temporary_bytes",
    "plan",
    "prepare_config",
    "resolve_gpu",
    "run_step_profile",
    "technique_table",
]

if TYPE_CHECKING:
    from anatomy.plan.config import default_task, depth_axes, layer_period, load_config
    from anatomy.plan.gpu import GpuMemory, nvml_gpu, resolve_gpu
    from anatomy.plan.model import build_model, enable_checkpointing, make_inputs, prepare_config
    from anatomy.plan.planner import ALLOCATOR_HEADROOM, Planner, plan
    from anatomy.plan.profile import StepProfile, run_step_profile
    from anatomy.plan.result import PlanResult
    from anatomy.plan.search import (
        BatchSearch,
        TechniqueRow,
        best_combination,
        largest_batch,
        technique_table,
    )
    from anatomy.plan.settings import OPTIMIZERS, PlanError, PlanSettings, Target, Task, check_settings
    from anatomy.plan.states import (
        ModelStates,
        model_states,
        optimizer_state_bytes,
        optimizer_step_temporary_bytes,
    )
    from anatomy.plan.workload import Workload


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'anatomy.plan' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"anatomy.plan.{module}"), name)
    globals()[name] = value
    return value
