"""The planner: one model config, many settings; each fake step run once and reused.

A plan is assembled from two parts: the model states (weights, gradients, optimizer states, from
the full model built on the meta device) and a step profile (activations, temporaries and the
forward/backward peaks, from the fake step, extrapolated in depth). The optimizer step's peak is
the states plus what the loop still holds after backward plus the step's own temporaries.

Target device. ``target="cpu"`` reproduces a CPU run exactly (the fake tensors are CPU tensors; the
accuracy tests compare against real CPU runs). ``target="cuda"`` (the default) models what CUDA
kernels keep instead (``anatomy.plan.kernels``), rounds allocations to the caching allocator's
512-byte blocks, models AdamW as torch's default foreach implementation (or ``optimizer_impl``),
and adds the guide's CUDA context figure and an allocator headroom calibrated on the guide's four
BERT-large runs (which the plan reproduces within 12%: tests/plan/test_guide.py).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from anatomy.plan.config import default_task
from anatomy.plan.depth import profile_by_depth
from anatomy.plan.gpu import resolve_gpu
from anatomy.plan.model import build_model, model_class, prepare_config
from anatomy.plan.moe import routing_note
from anatomy.plan.peft_model import adapted_states, adapter_key, adapter_notes
from anatomy.plan.profile import StepProfile, run_step_profile
from anatomy.plan.quiet import warnings_off
from anatomy.plan.result import PlanResult
from anatomy.plan.settings import PlanError, PlanSettings, Target, Task, check_gpu, check_settings
from anatomy.plan.states import (
    ModelStates,
    model_states,
    optimizer_state_bytes,
    optimizer_step_temporary_bytes,
)
from anatomy.plan.timeline import Category
from anatomy.plan.workload import Workload, forward_parameters, resolve_workload
from anatomy.techniques import GUIDE_CUDA_CONTEXT_BYTES
from anatomy.units import fmt_bytes
from anatomy.vocabulary import Component, Phase, Source

MIB = 1 << 20
# The caching allocator's reserve beyond the peak (cache and fragmentation), as a share of the bytes
# that churn every step (activations + temporaries at the peak). Calibrated on the guide's four
# BERT-large V100 runs (nvidia-smi: baseline, gradient accumulation, checkpointing, fp16), which
# this plan then reproduces within ~11% (tests/plan/test_guide.py); a prediction, not a rule.
ALLOCATOR_HEADROOM = 0.35


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


class Planner:
    """Plans for one model config; caches the model's states and each step profile it ran."""

    def __init__(self, config: Any, task: Task | str | None = None, name: str = "model") -> None:
        if task is not None and not isinstance(task, Task):
            try:
                task = Task(task)
            except ValueError:
                raise PlanError(
                    f"unknown task {task!r} (one of {', '.join(t.value for t in Task)})"
                ) from None
        self.task: Task = task or default_task(config)
        self.name = name
        self.model_class = model_class(config, self.task)
        self.forward_params = forward_parameters(self.model_class)
        self.supports_checkpointing = bool(
            getattr(self.model_class, "supports_gradient_checkpointing", False)
        )
        self.config = prepare_config(config, self.task)
        self._states: ModelStates | None = None
        self._adapted_states: dict[tuple, ModelStates] = {}
        self._profiles: dict[tuple, StepProfile] = {}

    @property
    def states(self) -> ModelStates:
        if self._states is None:
            try:
                with torch.device("meta"), warnings_off():
                    model = build_model(self.config, self.task)
            except Exception as exc:
                raise PlanError(
                    f"could not build {self.name}: {type(exc).__name__}: {_first_line(exc)}"
                ) from None
            self._states = model_states(model, self.config)
        return self._states

    @property
    def has_lora_defaults(self) -> bool:
        """PEFT has default LoRA target modules for this architecture (the technique table's rows)."""
        from anatomy.plan.peft_model import default_targets

        try:
            default_targets(self.config)
        except PlanError:
            return False
        return True

    def states_for(self, settings: PlanSettings) -> ModelStates:
        """The states of the model ``settings`` train: LoRA adapters and a quantized base included."""
        key = adapter_key(settings)
        if key == (None, None):
            return self.states
        if key not in self._adapted_states:
            self._adapted_states[key] = adapted_states(self.config, self.task, settings, self.name)
        return self._adapted_states[key]

    def check(self, settings: PlanSettings, gpu: str | None = None, gpu_bytes: int | None = None) -> Workload:
        """Every check a plan makes before running anything; returns the resolved workload."""
        check_settings(settings)
        check_gpu(gpu, gpu_bytes, settings.target)
        self.states_for(settings)  # LoRA targets that are not modules of the model: before the fake step
        if settings.gradient_checkpointing and not self.supports_checkpointing:
            raise PlanError(f"{self.model_class.__name__} does not support gradient checkpointing")
        return self.workload(settings)[0]

    def workload(self, settings: PlanSettings) -> tuple[Workload, list[str]]:
        return resolve_workload(self.config, self.task, settings, self.forward_params)

    def profile(self, settings: PlanSettings) -> StepProfile:
        workload, _ = self.workload(settings)
        key = (
            workload,
            settings.precision,
            settings.gradient_checkpointing,
            settings.grad_accum > 1,
            settings.target,
            settings.keep_outputs,
            settings.exact_depth,
            settings.fused_attention,
            adapter_key(settings),
        )
        if key not in self._profiles:
            self._profiles[key] = self._run_profile(workload, settings)
        return self._profiles[key]

    def _run_profile(self, workload: Workload, settings: PlanSettings) -> StepProfile:
        config = prepare_config(self.config, self.task, workload.use_cache)
        try:
            return profile_by_depth(
                config, settings.exact_depth, lambda cfg: run_step_profile(cfg, workload, settings)
            )
        except PlanError:
            raise
        except Exception as exc:
            text = _first_line(exc)
            if isinstance(exc, (OverflowError, RuntimeError)) and "overflow" in text.lower():
                raise PlanError(
                    f"{workload.describe()} is too large for torch to describe "
                    f"({type(exc).__name__}: {text}); plan a smaller batch"
                ) from None
            raise PlanError(
                f"could not run a fake training step of {self.name} ({self.task.value}): "
                f"{type(exc).__name__}: {text}"
            ) from None

    def plan(
        self, settings: PlanSettings, gpu: str | None = None, gpu_bytes: int | None = None
    ) -> PlanResult:
        started = time.perf_counter()
        self.check(settings, gpu, gpu_bytes)
        return self.assemble(settings, self.profile(settings), gpu, gpu_bytes, started)

    def assemble(
        self,
        settings: PlanSettings,
        prof: StepProfile,
        gpu: str | None = None,
        gpu_bytes: int | None = None,
        started: float | None = None,
    ) -> PlanResult:
        """The plan from a step profile (run, or synthesized by the batch search) and the model states."""
        started = time.perf_counter() if started is None else started
        workload, warnings = self.workload(settings)
        states = self.states_for(settings)
        target = settings.target
        opt_states = optimizer_state_bytes(settings.optimizer, states.shapes, target)
        opt_temp = optimizer_step_temporary_bytes(settings.optimizer, states, target, settings.optimizer_impl)
        weights = states.weight_bytes(target)
        grads = states.gradient_bytes(target)
        fwd = prof.forward.bytes + opt_states
        bwd = prof.backward.bytes + opt_states
        opt_peak = weights + grads + opt_states + prof.kept_after_backward + opt_temp
        phase_peaks = {Phase.FORWARD: fwd, Phase.BACKWARD: bwd, Phase.OPTIMIZER: opt_peak}
        peak_phase = max(phase_peaks, key=lambda p: phase_peaks[p])
        peak = phase_peaks[peak_phase]
        if peak_phase is Phase.OPTIMIZER:
            at = {
                Component.WEIGHTS: weights,
                Component.OPTIMIZER_STATES: opt_states,
                Component.GRADIENTS: grads,
                Component.ACTIVATIONS: 0,
                Component.TEMPORARIES: prof.kept_after_backward + opt_temp,
            }
        else:
            cats = (prof.forward if peak_phase is Phase.FORWARD else prof.backward).by_category
            at = {
                Component.WEIGHTS: cats[Category.PARAMETER] + cats[Category.WEIGHT_COPY],
                Component.OPTIMIZER_STATES: opt_states,
                Component.GRADIENTS: cats[Category.GRADIENT],
                Component.ACTIVATIONS: cats[Category.SAVED],
                Component.TEMPORARIES: cats[Category.TEMPORARY],
            }
        cuda = target == Target.CUDA
        context = GUIDE_CUDA_CONTEXT_BYTES if cuda else None
        headroom = (
            round(ALLOCATOR_HEADROOM * (at[Component.ACTIVATIONS] + at[Component.TEMPORARIES]))
            if cuda
            else None
        )
        components: dict[Component, int | None] = {
            Component.CUDA_CONTEXT: context,
            Component.ALLOCATOR_CACHE: headroom,
            Component.WEIGHTS: weights + prof.weight_copies,
            Component.OPTIMIZER_STATES: opt_states,
            Component.GRADIENTS: grads,
            Component.ACTIVATIONS: prof.activations,
            Component.TEMPORARIES: at[Component.TEMPORARIES],
        }
        sources = {c: Source.PREDICTED for c in components}
        sources[Component.CUDA_CONTEXT] = Source.GUIDE
        return PlanResult(
            model=self.name,
            model_class=states.model_class,
            task=self.task,
            settings=settings,
            workload=workload,
            parameter_count=states.parameter_count,
            trainable_parameters=states.trainable_count,
            components=components,
            sources=sources,
            at_peak=at,
            peak_bytes=peak,
            peak_phase=peak_phase,
            phase_peaks=phase_peaks,
            total_bytes=peak + (context or 0) + (headroom or 0),
            gpu=resolve_gpu(gpu, gpu_bytes) if cuda else None,
            kv_cache_bytes=prof.kv_cache,
            outputs_kept_bytes=prof.kept_after_backward if settings.keep_outputs else 0,
            notes=self._notes(settings, workload, prof),
            warnings=warnings,
            elapsed_s=time.perf_counter() - started,
        )

    def _notes(self, settings: PlanSettings, workload: Workload, prof: StepProfile) -> list[str]:
        notes = adapter_notes(settings)
        moe = routing_note(self.config)
        if moe:
            notes.append(moe)
        if prof.extrapolated_from:
            runs = prof.extrapolated_from
            if all(len(r) == 1 for r in runs):
                depths = " and ".join(f"{r[0]}-layer" for r in runs)
                notes.append(f"activations and peaks extrapolated linearly from {depths} runs")
            else:
                depths = ", ".join("/".join(str(d) for d in r) for r in runs)
                notes.append(
                    "activations and peaks extrapolated linearly from runs at "
                    f"{depths} encoder/decoder layers"
                )
        if prof.kv_cache:
            held = (
                "the loop's `out` keeps it through the optimizer step and the next forward (counted)"
                if settings.keep_outputs
                else "freed with the outputs after the loss"
            )
            notes.append(
                f"KV cache: in train mode the forward returns a {fmt_bytes(prof.kv_cache)} cache; {held}. "
                "model.config.use_cache = False (or use_cache=False in the call) drops it: --no-kv-cache"
            )
        if workload.padded:
            notes.append(
                "padded batch: an attention mask with padding, so the model builds a (batch, 1, seq, seq) "
                "mask and attention keeps it; --no-padding plans packed or equal-length batches"
            )
        if settings.target == Target.CUDA:
            notes.append(
                "CUDA kernels modelled: 1-byte dropout masks, "
                + ("fused (memory-efficient) attention" if settings.fused_attention else "unfused attention")
                + ", autocast's fp32 softmax/layer_norm, 512-byte allocator blocks; CUDA context is the "
                f"guide's {GUIDE_CUDA_CONTEXT_BYTES // MIB} MiB; allocator headroom "
                f"{ALLOCATOR_HEADROOM:.0%} of activations + temporaries (calibrated on the guide's runs)"
            )
        if (
            settings.optimizer == "adamw"
            and settings.target == Target.CUDA
            and settings.optimizer_impl is None
        ):
            notes.append(
                "AdamW step modelled as torch's foreach default (+4 B/param transient); "
                "--optimizer-impl fused (the Trainer's default) needs ~0"
            )
        if settings.grad_accum > 1:
            notes.append(
                f"gradient accumulation x{settings.grad_accum}: effective batch "
                f"{settings.batch_size * settings.grad_accum}"
            )
        return notes


def plan(model: str, settings: PlanSettings, gpu: str | None = None) -> PlanResult:
    """One plan for a model path or hub id (the CLI's default output)."""
    from anatomy.plan.config import load_config

    config = load_config(model)
    return Planner(config, settings.task, name=model).plan(settings, gpu)


__all__ = ["ALLOCATOR_HEADROOM", "Planner", "plan", "replace"]
