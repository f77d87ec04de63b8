"""The fake training step: the model's own forward and backward on fake tensors, watched.

The model is built under torch's FakeTensorMode (tensors with shapes and dtypes, no storage) and one
step is *run*: forward (with autocast for mixed precision) and backward execute the model's real
code, so what is saved for backward, what checkpointing recomputes and what the loss allocates are
the model's own, not a formula. Three instruments watch it:

* the :class:`~anatomy.plan.timeline.Timeline` sees every storage allocated and freed;
* ``saved_tensors_hooks`` around forward mark the storages kept for backward (the activations);
* the storages that end up as ``param.grad`` are the gradients.

The loop is a plain one: ``out = model(**batch)`` is held until the next forward returns (unless
``keep_outputs`` is off, as in the Trainer), so whatever ``out`` holds — logits, and the KV cache a
causal LM returns in train mode — stays alive through backward, the optimizer step and the next
forward. The step is of steady state: optimizer states exist (added by the planner), gradients are
None before the first backward (zero_grad's default), and with gradient accumulation a second
micro-batch runs with the gradients already present.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from anatomy.plan.kernels import cuda_kernels
from anatomy.plan.model import build_model, enable_checkpointing, make_inputs
from anatomy.plan.moe import fake_grouped_mm
from anatomy.plan.peft_model import adapt
from anatomy.plan.quiet import warnings_off
from anatomy.plan.settings import PlanError, PlanSettings, Target
from anatomy.plan.timeline import Category, Mark, PhasePeak, Timeline, replay, zero_categories
from anatomy.plan.values import is_fake
from anatomy.plan.workload import Workload
from anatomy.vocabulary import Precision


@dataclass(frozen=True)
class StepProfile:
    """One step's forward and backward (micro-batches included), without optimizer states."""

    activations: int  # saved for backward at the end of forward (max over micro-batches)
    weight_copies: int  # autocast's low-precision weight copies alive at the end of forward
    forward: PhasePeak
    backward: PhasePeak
    kept_after_backward: int  # what the loop's `out` still holds when backward ends (KV cache included)
    kv_cache: int  # the KV cache the forward returned (0: none)
    params_in_run: int
    extrapolated_from: tuple[tuple[int, ...], ...] | None = None  # depths of the runs behind it

    @staticmethod
    def combine(terms: list[tuple[StepProfile, float]]) -> StepProfile:
        """sum(weight * profile), field by field: every figure of a step is linear in the batch and,
        layers being identical, in each stack's depth."""

        def lin(values: list[int]) -> int:
            return max(0, round(sum(w * v for (_, w), v in zip(terms, values, strict=True))))

        def peak(get: Any) -> PhasePeak:
            peaks = [get(p) for p, _ in terms]
            return PhasePeak(
                lin([x.bytes for x in peaks]),
                {c: lin([x.by_category[c] for x in peaks]) for c in Category},
            )

        numbers = {
            f.name: lin([getattr(p, f.name) for p, _ in terms])
            for f in fields(StepProfile)
            if f.type in ("int", int)
        }
        return StepProfile(
            **numbers,
            forward=peak(lambda p: p.forward),
            backward=peak(lambda p: p.backward),
            extrapolated_from=None,
        )

    def scaled(self, other: StepProfile, factor: float) -> StepProfile:
        """self + (other - self) * factor (linear extrapolation in depth or batch)."""
        return StepProfile.combine([(self, 1.0 - factor), (other, factor)])

    def with_runs(self, depths: tuple[tuple[int, ...], ...]) -> StepProfile:
        return replace(self, extrapolated_from=depths)


def autocast(precision: Precision) -> contextlib.AbstractContextManager:
    if precision is Precision.BF16_MIXED:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if precision is Precision.FP16_MIXED:
        return torch.autocast("cpu", dtype=torch.float16)
    return contextlib.nullcontext()


def loss_of(out: Any) -> torch.Tensor:
    loss = out["loss"] if isinstance(out, dict) or hasattr(out, "keys") else out[0]
    if loss is None:
        raise PlanError("the model returned no loss for these labels")
    return loss


def cache_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors of the KV cache in a model output (transformers' Cache objects: a DynamicCache's
    layers, an EncoderDecoderCache's self- and cross-attention caches; legacy tuples too)."""
    # An explicit stack, not a recursive closure: a closure that refers to itself is a reference
    # cycle, and it would keep every tensor it found alive until the cyclic GC runs.
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    stack: list[Any] = []
    if hasattr(out, "get"):
        stack = [out.get(key) for key in ("past_key_values", "cache") if out.get(key) is not None]
    while stack:
        value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):
            stack.extend(vars(value).values())
    return found


# In-place random fills: on a fake tensor each leaves it as it was (no values, same storage, shape and
# dtype), and running one goes through torch's Python reference (a new tensor, then a copy).
_RANDOM_FILLS = frozenset(
    {torch.ops.aten.normal_.default, torch.ops.aten.uniform_.default, torch.ops.aten.bernoulli_.float}
)


class _InitValues(TorchDispatchMode):
    """While the fake model is built: a data-dependent read (``mask.any()`` in torch's trunc_normal_,
    which ViT's initialisation uses) answers zero instead of failing, and a random initialisation of a
    fake tensor returns the tensor without running (the weights' init is most of a build's ops).
    Initial values do not change what a step allocates, and nothing outside the model's construction
    runs under this mode."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func in _RANDOM_FILLS and is_fake(args[0]):
            return args[0]
        if func is torch.ops.aten._local_scalar_dense.default and is_fake(args[0]):
            dtype = args[0].dtype
            return False if dtype is torch.bool else (0.0 if dtype.is_floating_point else 0)
        return func(*args, **(kwargs or {}))


def run_step_profile(config: Any, workload: Workload, settings: PlanSettings) -> StepProfile:
    """Run forward + backward of ``config``'s model on fake tensors and replay the memory timeline."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    timeline = Timeline(settings.target, real_values=True)
    saved: set[int] = set()
    micro_batches = 2 if settings.grad_accum > 1 else 1
    fwd_end_ids: list[set[int]] = []
    cache_ids: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.add(timeline.register(t))
        return t

    with FakeTensorMode(allow_non_fake_inputs=True), warnings_off():
        with _InitValues():
            model = build_model(config, workload.task)
            model, quant_states = adapt(model, config, settings)
        model.train()
        if settings.gradient_checkpointing:
            enable_checkpointing(model)
        params = {p.untyped_storage()._cdata: p for p in model.parameters()}
        params.update({b.untyped_storage()._cdata: b for b in model.buffers()})
        params.update({t.untyped_storage()._cdata: t for t in quant_states})
        kernels = (
            cuda_kernels(settings.fused_attention)
            if settings.target == Target.CUDA
            else contextlib.nullcontext()
        )
        with timeline, kernels, fake_grouped_mm():
            for t in params.values():
                timeline.param_ids.add(timeline.register(t))
            params_in_run = timeline.bytes_of(timeline.param_ids)
            prev: Any = None  # the previous micro-batch's outputs, as a loop variable holds them
            for mb in range(micro_batches):
                inputs = make_inputs(config, workload)
                timeline.mark(Mark.FORWARD, mb)
                with (
                    torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
                    autocast(settings.precision),
                ):
                    out = model(**inputs)
                prev = None
                loss = loss_of(out)
                fwd_end_ids.append(timeline.live_ids())
                if mb == 0:
                    cache_ids = {timeline.register(t) for t in cache_tensors(out)}
                timeline.mark(Mark.BACKWARD, mb)
                if not settings.keep_outputs:
                    out = None
                del inputs
                loss.backward()
                timeline.mark(Mark.END, mb)
                prev = (out, loss)
                del out, loss
            grad_ids = {timeline.register(p.grad) for p in model.parameters() if p.grad is not None}
            kept_ids = timeline.live_ids()
            del prev

    def category(aid: int) -> Category:
        if aid in timeline.param_ids:
            return Category.PARAMETER
        if aid in timeline.copy_ids:
            return Category.WEIGHT_COPY
        if aid in grad_ids:
            return Category.GRADIENT
        if aid in saved:
            return Category.SAVED
        return Category.TEMPORARY

    cats = {aid: category(aid) for aid in timeline.sizes}
    peaks = replay(timeline, cats)
    # Whatever outlives backward besides parameters and gradients is held by the loop's `out`: the
    # logits, and the KV cache (whose storages autograd had also saved, so they are "saved" too).
    kept = timeline.bytes_of(i for i in kept_ids if cats[i] not in (Category.PARAMETER, Category.GRADIENT))
    # In steady state the previous step's outputs are still bound to the loop variable while the
    # first micro-batch's forward runs (later micro-batches ran with them in the replay already).
    first = peaks.get((Mark.FORWARD, 0))
    if first is not None:
        by = dict(first.by_category)
        by[Category.TEMPORARY] += kept
        peaks[(Mark.FORWARD, 0)] = PhasePeak(first.bytes + kept, by)

    def phase_peak(mark: Mark) -> PhasePeak:
        spans = [v for k, v in peaks.items() if k[0] is mark]
        return max(spans, key=lambda v: v.bytes, default=PhasePeak.empty())

    sizes = timeline.sizes
    activations = max(
        (sum(sizes[i] for i in ids if cats[i] is Category.SAVED) for ids in fwd_end_ids), default=0
    )
    copies = max(
        (sum(sizes[i] for i in ids if cats[i] is Category.WEIGHT_COPY) for ids in fwd_end_ids), default=0
    )
    return StepProfile(
        activations=activations,
        weight_copies=copies,
        forward=phase_peak(Mark.FORWARD),
        backward=phase_peak(Mark.BACKWARD),
        kept_after_backward=kept,
        kv_cache=timeline.bytes_of(cache_ids),
        params_in_run=params_in_run,
    )


__all__ = ["StepProfile", "autocast", "run_step_profile", "zero_categories"]
