"""A plan as text for an 80-column terminal pane, and as one JSON object.

Every line fits ``WIDTH`` columns: prose is wrapped between words, and a table row whose label is
too long (the best combination names several techniques) gets the label on a line of its own and
its figures on the next. Nothing here imports torch.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING, Any, TextIO

from anatomy import techniques
from anatomy.units import fmt_bytes
from anatomy.vocabulary import Component, Precision

if TYPE_CHECKING:
    from anatomy.plan.result import PlanResult
    from anatomy.plan.search import BatchSearch, TechniqueRow

PROG = "anatomy-top plan"
WIDTH = 80
INDENT = "  "
OPTIMIZER_LABELS = {
    "adamw": "AdamW",
    "adamw-8bit": "8-bit AdamW",
    "paged-adamw-8bit": "paged 8-bit AdamW",
    "sgd": "SGD with momentum",
    "adafactor": "Adafactor",
    "adafactor-torch": "Adafactor (torch)",
}
PRECISION_LABELS = {
    Precision.FP32: "fp32",
    Precision.FP16_MIXED: "fp16 mixed",
    Precision.BF16_MIXED: "bf16 mixed",
}
COMPONENT_ORDER = (
    Component.CUDA_CONTEXT,
    Component.ALLOCATOR_CACHE,
    Component.WEIGHTS,
    Component.OPTIMIZER_STATES,
    Component.GRADIENTS,
    Component.ACTIVATIONS,
    Component.TEMPORARIES,
)
PHASE_WHERE = {
    "forward": "at the end of forward",
    "backward": "during backward",
    "optimizer": "in the optimizer step",
}
# Where a row's speed factor was measured, in 11 columns; the legend above the table says it in full.
SPEED_SOURCE_SHORT = {
    "baseline": "-",
    techniques.GUIDE_SOURCE: techniques.GUIDE_SOURCE_SHORT,
    "product of guide factors (estimate)": "product",
    "no guide figure": "no figure",
}

# Technique table columns: label, peak, total, fits, speed, source.
_LABEL, _BYTES, _FITS, _SPEED, _SOURCE = 29, 11, 4, 5, 11


def wrap(text: str, indent: str = INDENT, hanging: str = "    ", width: int = WIDTH) -> str:
    """``text`` wrapped between words to ``width`` columns (long words are never split)."""
    return (
        textwrap.fill(
            text,
            width=width,
            initial_indent=indent,
            subsequent_indent=indent + hanging,
            break_long_words=False,
            break_on_hyphens=False,
        )
        + "\n"
    )


def describe(result: PlanResult) -> str:
    s = result.settings
    parts = [
        result.workload.describe(),
        PRECISION_LABELS.get(s.precision, s.precision.value),
        OPTIMIZER_LABELS.get(s.optimizer, s.optimizer),
    ]
    if s.lora_rank is not None:
        parts.append(f"{'QLoRA' if s.quant in ('nf4', 'fp4') else 'LoRA'} r={s.lora_rank}")
    if s.quant is not None:
        parts.append(f"{s.quant} base")
    if s.gradient_checkpointing:
        parts.append("gradient checkpointing")
    if s.grad_accum > 1:
        parts.append(f"grad-accum {s.grad_accum}")
    if result.kv_cache_bytes:
        parts.append("KV cache kept" if s.keep_outputs else "KV cache")
    return ", ".join(parts)


def _row(label: str, peak: str, total: str, fits: str, speed: str, source: str) -> str:
    figures = f"{peak:>{_BYTES}}{total:>{_BYTES}}  {fits:<{_FITS}}  {speed:>{_SPEED}}  {source}"
    if len(label) <= _LABEL:
        return f"{INDENT}{label:<{_LABEL}}{figures}".rstrip() + "\n"
    # The label on its own line(s), wrapped between words; its figures below, in their columns.
    return wrap(label, hanging="  ") + f"{INDENT}{'':<{_LABEL}}{figures}".rstrip() + "\n"


def render_techniques(rows: list[TechniqueRow], out: TextIO) -> None:
    w = out.write
    w("\n")
    w(
        wrap(
            "Techniques: peak and total are this plan's; speed is samples/s relative to the baseline as "
            f"the guide measured it on {techniques.GUIDE_MEASURED_ON} ({techniques.GUIDE_SOURCE_SHORT}), "
            "not for this model or GPU; 'product' multiplies such factors (an estimate)."
        )
    )
    w(_row("technique", "peak", "total", "fits", "speed", "speed from"))
    for row in rows:
        res = row.result
        fits = "-" if row.fits is None else ("yes" if row.fits else "no")
        speed = f"x{row.speed_factor:.2f}" if row.speed_factor is not None else "-"
        peak = fmt_bytes(res.peak_bytes) if res else "-"
        total = fmt_bytes(res.total_bytes) if res else "-"
        source = SPEED_SOURCE_SHORT.get(row.speed_source, row.speed_source)
        w(_row(row.label, peak, total, fits, speed, source))
    if not any(row.is_best for row in rows):
        w(f"{INDENT}best combination: nothing tried fits\n")


def render_text(
    result: PlanResult, rows: list[TechniqueRow] | None, batch: BatchSearch | None, out: TextIO
) -> None:
    r = result
    w = out.write
    millions = r.parameter_count / 1e6
    w(wrap(f"{PROG}: {r.model} ({r.model_class}, {r.task.value}), {millions:.1f} M parameters", ""))
    w(wrap(f"{describe(r)}; modelled for {r.settings.target.value.upper()}"))
    w("\n")
    w(f"{INDENT}{'Component':<24}{'Bytes':>12}{'B/param':>10}{'guide':>8}  source\n")
    guide = r.expected_bytes_per_param()
    for comp in COMPONENT_ORDER:
        value = r.components.get(comp)
        if value is None:
            continue
        per = f"{value / r.parameter_count:.2f}" if r.parameter_count else "-"
        g = guide.get(comp)
        expected = f"{g:g}" if g is not None else "-"
        w(f"{INDENT}{comp.label:<24}{fmt_bytes(value):>12}{per:>10}{expected:>8}  {r.sources[comp].value}\n")
    w("\n")
    w(wrap(f"Predicted peak (tensors): {fmt_bytes(r.peak_bytes)} {PHASE_WHERE.get(r.peak_phase.value, '')}"))
    at = ", ".join(f"{c.label.lower()} {fmt_bytes(v)}" for c, v in r.at_peak.items() if v)
    w(wrap(f"live at the peak: {at}", INDENT + "  "))
    phases = ", ".join(f"{p.value} {fmt_bytes(v)}" for p, v in r.phase_peaks.items())
    w(wrap(f"peak by phase: {phases}", INDENT + "  "))
    if r.gpu_bytes is not None:
        verdict = "fits" if r.fits else "does NOT fit"
        spare = r.spare_bytes or 0
        tail = f"{fmt_bytes(spare)} to spare" if spare >= 0 else f"{fmt_bytes(-spare)} over"
        w(
            wrap(
                f"With CUDA context and allocator headroom: {fmt_bytes(r.total_bytes)} of "
                f"{fmt_bytes(r.gpu_bytes)} ({r.gpu_name}, {r.gpu_source}): {verdict}, {tail}"
            )
        )
    if rows:
        render_techniques(rows, out)
    if batch is not None:
        w("\n")
        if batch.batch_size is None:
            w(wrap("Largest batch that fits: none (batch 1 does not fit)"))
        else:
            w(
                wrap(
                    f"Largest batch that fits: {batch.batch_size} (verified; "
                    f"~{fmt_bytes(batch.per_sample_bytes)} per sample, {batch.evaluations} plans)"
                )
            )
    for note in r.notes:
        w(wrap(f"note: {note}", hanging="      "))
    w(f"{INDENT}planned in {r.elapsed_s:.2f} s\n")


def to_json(result: PlanResult, rows: list[TechniqueRow] | None, batch: BatchSearch | None) -> dict[str, Any]:
    data = result.to_dict()
    if rows is not None:
        data["techniques"] = [
            {
                "label": row.label,
                "techniques": list(row.keys),
                "peak_bytes": row.result.peak_bytes if row.result else None,
                "total_bytes": row.result.total_bytes if row.result else None,
                "fits": row.fits,
                "speed_factor": row.speed_factor,
                "speed_source": row.speed_source,
                "speed_measured_on": techniques.GUIDE_MEASURED_ON if row.speed_factor and row.keys else None,
                "settings": row.settings.to_dict(),
            }
            for row in rows
        ]
    if batch is not None:
        data["largest_batch"] = {
            "batch_size": batch.batch_size,
            "per_sample_bytes": batch.per_sample_bytes,
            "evaluations": batch.evaluations,
            "total_bytes": batch.result.total_bytes if batch.result else None,
        }
    return data
