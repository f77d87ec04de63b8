"""What to change when a step does not fit: each technique of the guide alone, the fastest combination
that fits, and the largest micro-batch that fits.

Memory comes from plans of this model; speed is the guide's samples/s factor, measured on
BERT-large on a V100 (``anatomy.techniques``) and labelled as such on every row — a guide figure,
never a prediction for this model or GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from anatomy import techniques
from anatomy.plan.planner import Planner
from anatomy.plan.result import PlanResult
from anatomy.plan.settings import MAX_PIXELS, MAX_TOKENS, PlanError, PlanSettings, Task
from anatomy.vocabulary import Phase, Precision


class SpeedSource:
    """Where a row's speed factor comes from (one short label for tables, one sentence for JSON)."""

    BASELINE = "baseline"
    GUIDE = techniques.GUIDE_SOURCE
    PRODUCT = "product of guide factors (estimate)"
    NONE = "no guide figure"


@dataclass
class TechniqueRow:
    label: str
    keys: tuple[str, ...]
    settings: PlanSettings
    result: PlanResult | None
    speed_factor: float | None
    speed_source: str
    note: str = ""

    @property
    def fits(self) -> bool | None:
        return None if self.result is None else self.result.fits

    @property
    def is_best(self) -> bool:
        return self.label.startswith(BEST_PREFIX)


BEST_PREFIX = "best combination: "


def _grad_accum_variant(settings: PlanSettings) -> PlanSettings | None:
    """Same effective batch in k micro-batches (the guide: batch 4 -> 1 x 4)."""
    if settings.grad_accum > 1 or settings.batch_size < 2:
        return None
    k = min(4, settings.batch_size)
    while settings.batch_size % k:
        k -= 1
    return replace(settings, batch_size=settings.batch_size // k, grad_accum=k)


def single_techniques(settings: PlanSettings, checkpointing: bool = True) -> list[tuple[str, PlanSettings]]:
    """Each technique the guide describes that ``settings`` do not use yet (``checkpointing``: the
    model supports gradient checkpointing)."""
    out: list[tuple[str, PlanSettings]] = []
    accum = _grad_accum_variant(settings)
    if accum is not None:
        out.append((techniques.GRAD_ACCUM, accum))
    if checkpointing and not settings.gradient_checkpointing:
        out.append((techniques.CHECKPOINTING, replace(settings, gradient_checkpointing=True)))
    if settings.precision is Precision.FP32:
        out.append((techniques.MIXED_PRECISION, replace(settings, precision=Precision.BF16_MIXED)))
    if settings.optimizer == "adamw":
        out.append((techniques.ADAMW_8BIT, replace(settings, optimizer="adamw-8bit")))
        out.append((techniques.ADAFACTOR, replace(settings, optimizer="adafactor")))
    return out


def adapter_techniques(settings: PlanSettings, lora: bool) -> list[tuple[str, PlanSettings]]:
    """Rows beside the guide's techniques: paged 8-bit AdamW, and LoRA / QLoRA at rank 8 on PEFT's
    default targets (``lora``: PEFT has defaults for the architecture). Not in the best combination:
    LoRA trains another set of weights than full fine-tuning, so it is the user's choice, not a
    drop-in saving; paged 8-bit AdamW holds what 8-bit AdamW holds while it stays resident."""
    out: list[tuple[str, PlanSettings]] = []
    if settings.optimizer == "adamw":
        out.append((techniques.PAGED_ADAMW_8BIT, replace(settings, optimizer="paged-adamw-8bit")))
    if lora and settings.lora_rank is None and settings.quant is None:
        out.append((techniques.LORA, replace(settings, lora_rank=8)))
        out.append((techniques.QLORA, replace(settings, lora_rank=8, quant="nf4")))
    return out


def _speed_source(factor: float | None, keys: tuple[str, ...]) -> str:
    if not keys:
        return SpeedSource.BASELINE
    if factor is None:
        return SpeedSource.NONE
    known = [k for k in keys if techniques.TECHNIQUES[k].speed_factor is not None]
    return SpeedSource.GUIDE if len(known) == 1 else SpeedSource.PRODUCT


def technique_table(
    planner: Planner, settings: PlanSettings, gpu: str | None = None, gpu_bytes: int | None = None
) -> list[TechniqueRow]:
    """Baseline, each technique alone, and the fastest combination that fits (guide speed factors)."""
    rows = [
        TechniqueRow(
            "baseline", (), settings, planner.plan(settings, gpu, gpu_bytes), 1.0, SpeedSource.BASELINE
        )
    ]
    for key, variant in single_techniques(settings, planner.supports_checkpointing):
        tech = techniques.TECHNIQUES[key]
        label = tech.label
        if key == techniques.GRAD_ACCUM:
            label += f" ({variant.batch_size} x {variant.grad_accum})"
        rows.append(
            TechniqueRow(
                label,
                (key,),
                variant,
                planner.plan(variant, gpu, gpu_bytes),
                tech.speed_factor,
                _speed_source(tech.speed_factor, (key,)),
            )
        )
    for key, variant in adapter_techniques(settings, planner.has_lora_defaults):
        tech = techniques.TECHNIQUES[key]
        rows.append(
            TechniqueRow(
                tech.label, (key,), variant, planner.plan(variant, gpu, gpu_bytes), None, SpeedSource.NONE
            )
        )
    best = best_combination(planner, settings, gpu, gpu_bytes)
    if best is not None:
        rows.append(best)
    return rows


def best_combination(
    planner: Planner, settings: PlanSettings, gpu: str | None = None, gpu_bytes: int | None = None
) -> TechniqueRow | None:
    """The combination that fits with the best guide speed factor (a technique without a guide figure
    counts as 1.0); ties go to fewer techniques, then to less memory. The baseline itself is a
    candidate: when it fits, nothing slower is recommended."""
    singles = dict(single_techniques(settings, planner.supports_checkpointing))
    keys = list(singles)
    candidates: list[TechniqueRow] = []
    for mask in range(1 << len(keys)):
        chosen = tuple(k for i, k in enumerate(keys) if mask >> i & 1)
        if techniques.ADAMW_8BIT in chosen and techniques.ADAFACTOR in chosen:
            continue
        variant = settings
        for k in chosen:
            single = singles[k]
            if k == techniques.GRAD_ACCUM:
                variant = replace(variant, batch_size=single.batch_size, grad_accum=single.grad_accum)
            elif k == techniques.CHECKPOINTING:
                variant = replace(variant, gradient_checkpointing=True)
            elif k == techniques.MIXED_PRECISION:
                variant = replace(variant, precision=single.precision)
            else:
                variant = replace(variant, optimizer=single.optimizer)
        result = planner.plan(variant, gpu, gpu_bytes)
        factor = techniques.combined_speed_factor(chosen) if chosen else 1.0
        names = " + ".join(techniques.TECHNIQUES[k].label for k in chosen) or "baseline as is"
        candidates.append(
            TechniqueRow(BEST_PREFIX + names, chosen, variant, result, factor, _speed_source(factor, chosen))
        )
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        return None
    return max(
        fitting,
        key=lambda c: (
            c.speed_factor if c.speed_factor is not None else 1.0,
            -len(c.keys),
            -(c.result.total_bytes if c.result else 0),
        ),
    )


@dataclass
class BatchSearch:
    batch_size: int | None  # None: not even batch 1 fits
    result: PlanResult | None  # the verified plan at batch_size
    per_sample_bytes: int
    evaluations: int


def largest_batch(
    planner: Planner,
    settings: PlanSettings,
    gpu: str | None = None,
    gpu_bytes: int | None = None,
    limit: int = 1 << 16,
    max_runs: int = 8,
) -> BatchSearch:
    """Largest micro-batch that fits, every answer verified by a plan of its own.

    Each figure of a step is linear in the batch at any one moment of the step, so a phase's peak —
    the largest of them — is piecewise linear and convex in the batch (at small batches the weights
    and gradients can set the backward peak; at large ones the activations do). The search uses
    that: a line through two planned batches predicts the next batch to plan (beyond them it is
    optimistic, between them pessimistic), so a handful of fake steps bracket the answer: the
    largest batch that fits next to a batch one larger that does not. ``max_runs`` bounds the fake
    steps after the first two; the result is then the largest batch verified to fit."""
    one_settings = replace(settings, batch_size=1)
    one = planner.plan(one_settings, gpu, gpu_bytes)
    if one.gpu_bytes is None:
        raise PlanError("no GPU memory to fit against")
    if not one.fits:
        return BatchSearch(None, one, 0, 1)
    workload = one.workload
    if planner.task is Task.IMAGE_CLASSIFICATION:
        assert workload.image_size is not None
        limit = min(limit, MAX_PIXELS // workload.image_size**2)
    else:
        longest = max(workload.seq_len or 1, workload.target_len or 1)
        limit = min(limit, MAX_TOKENS // longest)
    limit = max(1, limit)
    planned: dict[int, PlanResult] = {1: one}

    def plan_at(b: int) -> PlanResult:
        if b not in planned:
            planned[b] = planner.plan(replace(settings, batch_size=b), gpu, gpu_bytes)
        return planned[b]

    def line_fit(a: int, b: int, low: int, high: int) -> int:
        """Largest batch in [low, high] whose plan on the line through batches a and b fits."""
        pa, pb = (
            planner.profile(replace(settings, batch_size=a)),
            planner.profile(replace(settings, batch_size=b)),
        )

        def fits(n: int) -> bool:
            prof = pa.scaled(pb, (n - a) / (b - a))
            return bool(planner.assemble(replace(settings, batch_size=n), prof, gpu, gpu_bytes).fits)

        while low < high:
            mid = (low + high + 1) // 2
            if fits(mid):
                low = mid
            else:
                high = mid - 1
        return low

    two = plan_at(min(2, limit))
    per_sample = max(
        0,
        max(two.phase_peaks[p] - one.phase_peaks[p] for p in (Phase.FORWARD, Phase.BACKWARD)),
        two.total_bytes - one.total_bytes,
    )
    lo, hi = (2, None) if two.fits and limit >= 2 else (1, 2)  # verified fit; smallest verified non-fit
    prev = 1
    for _ in range(max_runs):
        if hi is not None and hi <= lo + 1:
            break
        top = (hi - 1) if hi is not None else limit
        if top <= lo:
            break
        # Beyond the last fit: the line through the last two fits (optimistic). Between a fit and a
        # non-fit: the chord between them (pessimistic, so it never skips past the answer).
        guess = line_fit(prev, lo, lo, top) if hi is None else line_fit(lo, hi, lo, top)
        guess = max(guess, lo + 1)
        if plan_at(guess).fits:
            prev, lo = lo, guess
            if guess == limit:
                break
        else:
            hi = guess
    return BatchSearch(lo, planned[lo], per_sample, len(planned))
