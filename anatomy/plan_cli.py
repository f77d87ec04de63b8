"""`anatomy-top plan MODEL ...`: the pre-flight anatomy of a training step, before any GPU is touched.

tui/cli.py hands the arguments after ``plan`` to ``main``; ``python -m anatomy.plan_cli`` works too.
Output is plain text (nothing is interpreted as markup) or, with ``--json``, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from anatomy.units import fmt_bytes
from anatomy.vocabulary import Component, Precision

PROG = "anatomy-top plan"
_PRECISIONS = {"fp32": Precision.FP32, "fp16": Precision.FP16_MIXED, "bf16": Precision.BF16_MIXED}
_OPTIMIZER_LABELS = {
    "adamw": "AdamW",
    "adamw-8bit": "8-bit AdamW",
    "sgd": "SGD with momentum",
    "adafactor": "Adafactor",
    "adafactor-torch": "Adafactor (torch)",
}
_COMPONENT_ORDER = (
    Component.CUDA_CONTEXT,
    Component.ALLOCATOR_CACHE,
    Component.WEIGHTS,
    Component.OPTIMIZER_STATES,
    Component.GRADIENTS,
    Component.ACTIVATIONS,
    Component.TEMPORARIES,
)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Predict a training step's memory anatomy (weights, optimizer states, gradients, "
        "activations, temporaries) from a transformers config, without allocating it: the model runs "
        "one forward and backward on fake tensors.",
    )
    p.add_argument(
        "model", help="a directory with config.json, a config.json path, or a hub id (needs network)"
    )
    p.add_argument("--batch-size", type=_positive, default=4, help="micro-batch size (default 4)")
    p.add_argument("--seq-len", type=_positive, default=512, help="sequence length (default 512)")
    p.add_argument(
        "--precision", choices=sorted(_PRECISIONS), default="fp32", help="fp16/bf16 = mixed precision"
    )
    p.add_argument("--optimizer", choices=["adamw", "adamw-8bit", "sgd", "adafactor"], default="adamw")
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument(
        "--grad-accum", type=_positive, default=1, metavar="N", help="micro-batches per optimizer step"
    )
    p.add_argument(
        "--gpu", metavar="NAME", help="e.g. H100-80GB, A100-40GB, or a size like 24GiB (default: NVML)"
    )
    p.add_argument(
        "--task",
        choices=["causal-lm", "sequence-classification", "masked-lm"],
        help="the head to train (default: from config.architectures)",
    )
    p.add_argument(
        "--target",
        choices=["cuda", "cpu"],
        default="cuda",
        help="which kernels' memory to model (cpu: what a CPU run measures)",
    )
    p.add_argument(
        "--attention",
        choices=["fused", "math"],
        default="fused",
        help="CUDA attention kernel: fused (flash/memory-efficient) or math (saves the probabilities)",
    )
    p.add_argument(
        "--optimizer-impl",
        choices=["foreach", "fused", "for-loop"],
        help="AdamW implementation (default: torch's choice, foreach on CUDA; the Trainer uses fused)",
    )
    p.add_argument(
        "--loop",
        choices=["plain", "trainer"],
        default="plain",
        help="plain: `out = model(...)` held until the step ends, torch's AdamW default; "
        "trainer: the HF Trainer (outputs dropped after the loss, fused AdamW)",
    )
    p.add_argument("--exact-depth", action="store_true", help="run every layer instead of extrapolating")
    p.add_argument("--quick", action="store_true", help="skip the technique table and the batch-size search")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p


def _settings(args: argparse.Namespace) -> Any:
    from anatomy.plan import PlanSettings

    return PlanSettings(
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        precision=_PRECISIONS[args.precision],
        optimizer=args.optimizer,
        gradient_checkpointing=args.gradient_checkpointing,
        grad_accum=args.grad_accum,
        task=args.task,
        target=args.target,
        exact_depth=args.exact_depth,
        fused_attention=args.attention == "fused",
        optimizer_impl=args.optimizer_impl or ("fused" if args.loop == "trainer" else None),
        keep_outputs=args.loop == "plain",
    )


def _describe(s: Any) -> str:
    parts = [
        f"batch {s.batch_size} x seq {s.seq_len}",
        {"fp32": "fp32", "fp16_mixed": "fp16 mixed", "bf16_mixed": "bf16 mixed"}.get(s.precision.value, "?"),
        _OPTIMIZER_LABELS.get(s.optimizer, s.optimizer),
    ]
    if s.gradient_checkpointing:
        parts.append("gradient checkpointing")
    if s.grad_accum > 1:
        parts.append(f"grad-accum {s.grad_accum}")
    return ", ".join(parts)


def render_text(result: Any, rows: list[Any] | None, batch: Any | None, out: TextIO) -> None:
    r = result
    w = out.write
    w(f"{PROG}: {r.model} ({r.model_class}, {r.task}), {r.parameter_count / 1e6:.1f} M parameters\n")
    w(f"  {_describe(r.settings)}; modelled for {r.settings.target.upper()}\n\n")
    w(f"  {'Component':<24}{'Bytes':>12}{'B/param':>10}{'guide':>8}  source\n")
    guide = r.expected_bytes_per_param()
    for comp in _COMPONENT_ORDER:
        value = r.components.get(comp)
        if value is None:
            continue
        per = f"{value / r.parameter_count:.2f}" if r.parameter_count else "-"
        g = guide.get(comp)
        w(f"  {comp.label:<24}{fmt_bytes(value):>12}{per:>10}{(f'{g:g}' if g is not None else '-'):>8}  ")
        w(f"{r.sources[comp].value}\n")
    where = {
        "forward": "at the end of forward",
        "backward": "during backward",
        "optimizer": "in the optimizer step",
    }
    w(f"\n  Predicted peak (tensors): {fmt_bytes(r.peak_bytes)} {where.get(r.peak_phase.value, '')}\n")
    at = ", ".join(f"{c.label.lower()} {fmt_bytes(v)}" for c, v in r.at_peak.items() if v)
    w(f"    live at the peak: {at}\n")
    phases = ", ".join(f"{p.value} {fmt_bytes(v)}" for p, v in r.phase_peaks.items())
    w(f"    peak by phase: {phases}\n")
    if r.gpu_bytes is not None:
        verdict = "fits" if r.fits else "does NOT fit"
        spare = r.spare_bytes or 0
        tail = f"{fmt_bytes(spare)} to spare" if spare >= 0 else f"{fmt_bytes(-spare)} over"
        w(
            f"  With CUDA context and allocator headroom: {fmt_bytes(r.total_bytes)} of "
            f"{fmt_bytes(r.gpu_bytes)} ({r.gpu_name}, {r.gpu_source}): {verdict}, {tail}\n"
        )
    if rows:
        w("\n  Techniques (memory: this plan; speed: samples/s factor as measured in the guide)\n")
        w(f"  {'':<52}{'peak':>11}{'total':>11}  {'fits':<5}{'speed':>7}  speed source\n")
        for row in rows:
            res = row.result
            fits = "-" if row.fits is None else ("yes" if row.fits else "no")
            speed = f"x{row.speed_factor:.2f}" if row.speed_factor is not None else "-"
            label = row.label if len(row.label) <= 50 else row.label[:49] + "…"
            w(
                f"  {label:<52}{fmt_bytes(res.peak_bytes):>11}{fmt_bytes(res.total_bytes):>11}  "
                f"{fits:<5}{speed:>7}  {row.speed_source}\n"
            )
        if not any(row.label.startswith("best combination") for row in rows):
            w("  best combination: nothing tried fits\n")
    if batch is not None:
        if batch.batch_size is None:
            w("\n  Largest batch that fits: none (batch 1 does not fit)\n")
        else:
            w(
                f"\n  Largest batch that fits: {batch.batch_size} (verified; "
                f"~{fmt_bytes(batch.per_sample_bytes)} per sample, {batch.evaluations} plans)\n"
            )
    for note in r.notes:
        w(f"  note: {note}\n")
    w(f"  planned in {r.elapsed_s:.2f} s\n")


def to_json(result: Any, rows: list[Any] | None, batch: Any | None) -> dict[str, Any]:
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
                "settings": row.result.to_dict()["settings"] if row.result else None,
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


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage or help
        return int(exc.code or 0)
    try:
        from anatomy.plan import (
            PlanError,
            Planner,
            largest_batch,
            load_config,
            technique_table,
        )
    except ImportError as exc:
        err.write(f"{PROG}: needs torch and transformers (pip install 'anatomy-top[train]'): {exc}\n")
        return 2
    try:
        settings = _settings(args)
        config = load_config(args.model)
        planner = Planner(config, args.task, name=args.model)
        result = planner.plan(settings, args.gpu)
        rows = batch = None
        if not args.quick and settings.target == "cuda":
            rows = technique_table(planner, settings, args.gpu)
            batch = largest_batch(planner, settings, args.gpu)
    except PlanError as exc:
        err.write(f"{PROG}: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a value, not a traceback: say what failed
        err.write(f"{PROG}: failed: {type(exc).__name__}: {str(exc)[:500]}\n")
        return 1
    if args.json:
        out.write(json.dumps(to_json(result, rows, batch), indent=2) + "\n")
    else:
        render_text(result, rows, batch, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
