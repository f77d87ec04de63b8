"""`anatomy-top plan MODEL ...`: the pre-flight anatomy of a training step, before any GPU is touched.

tui/cli.py hands the arguments after ``plan`` to ``main``; ``python -m anatomy.plan_cli`` works too.
Every argument is checked before torch is imported and before the fake step runs: a bad value is
one line on stderr and exit status 2. Output is plain text for an 80-column pane (nothing is
interpreted as markup) or, with ``--json``, one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import textwrap
from typing import Any, NoReturn, TextIO

from anatomy.plan.report import PROG, render_text, to_json, wrap
from anatomy.plan.settings import (
    OPTIMIZER_IMPLS,
    QUANT_TYPES,
    PlanError,
    PlanSettings,
    Target,
    Task,
    check_gpu,
    check_settings,
)
from anatomy.vocabulary import Precision

_PRECISIONS = {"fp32": Precision.FP32, "fp16": Precision.FP16_MIXED, "bf16": Precision.BF16_MIXED}


def _whole(text: str) -> int:
    """A whole number >= 1; ``1e6`` is read as 1000000 (it is a whole number)."""
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if number != number or number in (float("inf"), float("-inf")) or not number.is_integer():
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        value = int(number)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _sizes(text: str) -> tuple[int, ...]:
    """World sizes: ``2`` or ``2,4,8``; their range is checked with the other settings."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a world size or a list like 2,4,8") from None


def _fill(text: str, first: str = "", rest: str = "") -> str:
    return textwrap.fill(text, width=79, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False)


def _tasks_epilog() -> str:
    lines = ["tasks (--task; default: from the config's architectures):"]
    for task in Task:
        lines.append(_fill(task.help, f"  {task.value:<24}", " " * 26))
    lines.append("")
    lines.append(
        _fill(
            "Speed factors in the technique table are the guide's, measured on BERT-large on a V100; "
            "each row says so. Nothing is downloaded: MODEL's config.json is enough."
        )
    )
    return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr (and exit status 2), not the whole usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (--help lists every option)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description=_fill(
            "Predict a training step's memory anatomy (weights, optimizer states, gradients, "
            "activations, temporaries) from a transformers config, without allocating it: the model "
            "runs one forward and backward on fake tensors."
        ),
        epilog=_tasks_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "model",
        nargs="?",
        help="a directory with config.json, a config.json path, or a hub id (needs network)",
    )
    p.add_argument(
        "--like",
        type=_whole,
        metavar="PID",
        help="plan the job training process PID runs (its hook's config and batch shape) and show "
        "plan vs measured per component",
    )
    p.add_argument(
        "--task",
        choices=[t.value for t in Task],
        metavar="TASK",
        help="the head to train: " + ", ".join(t.value for t in Task) + " (see below)",
    )
    p.add_argument("--batch-size", type=_whole, default=4, metavar="N", help="micro-batch size (default 4)")
    p.add_argument(
        "--seq-len",
        type=_whole,
        metavar="N",
        help="tokens per sequence; seq2seq-lm: source tokens (default 512)",
    )
    p.add_argument(
        "--target-len",
        type=_whole,
        metavar="N",
        help="seq2seq-lm: label tokens (default: --seq-len); speech-seq2seq: label tokens (default "
        "128, at most the model's decoder positions)",
    )
    p.add_argument(
        "--audio-seconds",
        type=_seconds,
        metavar="S",
        help="speech-seq2seq: seconds of audio per clip (default: the model's window, 30 s for Whisper)",
    )
    p.add_argument(
        "--image-size",
        type=_whole,
        metavar="PX",
        help="image-classification: pixels per side (default: the config's image_size)",
    )
    p.add_argument(
        "--padding",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="plan padded batches: an attention mask with padding, from which the model builds a "
        "(batch, 1, seq, seq) mask (default: on for text models, whose forward takes a mask); "
        "--no-padding: packed or equal-length batches fed without a mask",
    )
    p.add_argument(
        "--kv-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the forward returns a KV cache, which a plain loop's `out` keeps alive through the "
        "optimizer step and the next forward (default: the config's use_cache, as training gets "
        "it); --no-kv-cache plans model.config.use_cache = False",
    )
    p.add_argument(
        "--precision", choices=sorted(_PRECISIONS), default="fp32", help="fp16/bf16 = mixed precision"
    )
    p.add_argument(
        "--optimizer",
        choices=["adamw", "adamw-8bit", "paged-adamw-8bit", "sgd", "adafactor"],
        default="adamw",
    )
    _add_adapter_options(p)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument(
        "--grad-accum", type=_whole, default=1, metavar="N", help="micro-batches per optimizer step"
    )
    p.add_argument(
        "--gpu", metavar="NAME", help="e.g. H100-80GB, A100-40GB, or a size like 24GiB (default: NVML)"
    )
    p.add_argument(
        "--target",
        choices=[t.value for t in Target],
        default="cuda",
        help="which kernels' memory to model (cpu: what a CPU run measures; no GPU fit)",
    )
    p.add_argument(
        "--attention",
        choices=["fused", "math"],
        default="fused",
        help="CUDA attention kernel: fused (flash/memory-efficient) or math (saves the probabilities)",
    )
    p.add_argument(
        "--optimizer-impl",
        choices=list(OPTIMIZER_IMPLS),
        help="AdamW implementation (default: torch's choice, foreach on CUDA; the Trainer uses fused)",
    )
    p.add_argument(
        "--loop",
        choices=["plain", "trainer"],
        default="plain",
        help="plain: `out = model(...)` held until the step ends, torch's AdamW default; "
        "trainer: the HF Trainer (outputs dropped after the loss, fused AdamW)",
    )
    p.add_argument(
        "--fsdp",
        type=_sizes,
        default=(),
        metavar="N[,N...]",
        help="plan rank 0 of an FSDP2 job (fully_shard per transformer block and the root) on N ranks; "
        "a column per world size",
    )
    p.add_argument("--ddp", type=_sizes, default=(), metavar="N[,N...]", help="plan one rank of a DDP job")
    p.add_argument("--zero", type=int, metavar="STAGE", help="plan one rank of DeepSpeed ZeRO-1, 2 or 3")
    p.add_argument(
        "--world-size", type=_sizes, default=(), metavar="N[,N...]", help="--zero: ranks partitioned over"
    )
    p.add_argument("--exact-depth", action="store_true", help="run every layer instead of extrapolating")
    p.add_argument("--quick", action="store_true", help="skip the technique table and the batch-size search")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 3600] seconds")
    return value


def _dropout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability") from None
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} must be in [0, 1)")
    return value


def _add_adapter_options(p: argparse.ArgumentParser) -> None:
    """LoRA / QLoRA / a quantized base (anatomy.plan.peft_model, anatomy.plan.quant)."""
    p.add_argument(
        "--lora",
        type=_whole,
        metavar="R",
        help="LoRA adapters of rank R (PEFT): the base frozen, gradients and optimizer states for "
        "the adapters only",
    )
    p.add_argument(
        "--lora-targets",
        metavar="M,M",
        help="modules to adapt, e.g. q_proj,v_proj (default: PEFT's defaults for the architecture)",
    )
    p.add_argument(
        "--lora-dropout",
        type=_dropout,
        default=0.0,
        metavar="P",
        help="LoRA dropout (default 0, PEFT's); above 0 each adapted layer saves its dropped input",
    )
    p.add_argument(
        "--qlora",
        action="store_true",
        help="QLoRA: the base in 4-bit nf4 with double quantization and bf16 compute (bitsandbytes), "
        "LoRA on top (rank from --lora, default 8)",
    )
    p.add_argument(
        "--quant",
        choices=list(QUANT_TYPES),
        help="a bitsandbytes-quantized frozen base (nf4, fp4: 4-bit; int8: LLM.int8()); with --lora, "
        "LoRA on it",
    )


def settings_from(args: argparse.Namespace) -> PlanSettings:
    targets = None
    if args.lora_targets is not None:
        targets = tuple(t.strip() for t in args.lora_targets.split(","))
    rank = args.lora if args.lora is not None else (8 if args.qlora else None)
    return PlanSettings(
        lora_rank=rank,
        lora_targets=targets,
        lora_dropout=args.lora_dropout,
        quant=args.quant or ("nf4" if args.qlora else None),
        audio_seconds=args.audio_seconds,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        precision=_PRECISIONS[args.precision],
        optimizer=args.optimizer,
        gradient_checkpointing=args.gradient_checkpointing,
        grad_accum=args.grad_accum,
        task=Task(args.task) if args.task else None,
        target=Target(args.target),
        exact_depth=args.exact_depth,
        fused_attention=args.attention == "fused",
        optimizer_impl=args.optimizer_impl or ("fused" if args.loop == "trainer" else None),
        keep_outputs=args.loop == "plain",
        padded=args.padding,
        use_cache=args.kv_cache,
        target_len=args.target_len,
        image_size=args.image_size,
        fsdp=args.fsdp,
        ddp=args.ddp,
        zero=args.zero,
        world_size=args.world_size,
    )


def main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None, lean: bool = False
) -> int:
    """``lean``: the process is the command's own (``anatomy-top plan``), so it may import lean
    (:mod:`anatomy.plan.lean`); a caller's process (tests, a notebook) keeps transformers as it is."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage or help
        return int(exc.code or 0)
    try:
        # Everything that needs no model, before torch is imported.
        settings = settings_from(args)
        check_settings(settings)
        check_gpu(args.gpu, None, settings.target)
        if (args.model is None) == (args.like is None):
            raise PlanError("give MODEL (a config directory or file) or --like PID, one of them")
    except PlanError as exc:
        err.write(f"{PROG}: {exc}\n")
        return 2
    if args.like is not None:
        return _like(args.like, settings, args.json, out, err)
    if lean:
        # Until the plan is made, no cyclic garbage collection: each full collection walks every object
        # that importing torch and transformers created (a sixth of a --quick process's CPU time). The
        # plan never depends on the collector (what the step frees is freed by reference counting, as
        # in training); it is back on for the technique table's plans.
        gc.disable()
    try:
        from anatomy.plan.lean import lean_imports

        if lean and settings.quant is None:  # bitsandbytes' quantized layers need accelerate
            lean_imports()  # before any model code: transformers' accelerate/DeepSpeed integrations unused
        from anatomy.plan.config import load_config
        from anatomy.plan.planner import Planner
        from anatomy.plan.search import largest_batch, technique_table
    except ImportError as exc:
        err.write(f"{PROG}: needs torch and transformers (pip install 'anatomy-top[train]'): {exc}\n")
        return 2
    try:
        config = load_config(args.model)
        planner = Planner(config, settings.task, name=args.model)
        # Everything that needs the config, before the fake step runs.
        planner.check(settings, args.gpu)
        for warning in planner.workload(settings)[1]:
            err.write(wrap(f"{PROG}: warning: {warning}", "", "  "))
        result = planner.plan(settings, args.gpu)
        gc.enable()
        rows: list[Any] | None = None
        batch: Any | None = None
        ranks: list[Any] = []
        if settings.fsdp or settings.ddp or settings.zero is not None:
            from anatomy.plan.sharding import rank_plans

            ranks = rank_plans(planner, settings, args.gpu)
        if not args.quick and settings.target == Target.CUDA and not ranks:
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
        doc = to_json(result, rows, batch)
        if ranks:
            doc["ranks"] = [r.to_dict() for r in ranks]
        out.write(json.dumps(doc, indent=2) + "\n")
    else:
        render_text(result, rows, batch, out)
        if ranks:
            from anatomy.plan.rank_report import render_ranks

            render_ranks(ranks, out)
    return 0


def _like(pid: int, settings: PlanSettings, as_json: bool, out: TextIO, err: TextIO) -> int:
    """`--like PID`: the plan of that process's job beside what its hook measured."""
    from anatomy.plan.like import run

    try:
        run(pid, settings, as_json, out)
    except PlanError as exc:
        err.write(f"{PROG}: {exc}\n")
        return 2
    except Exception as exc:  # a value, not a traceback: say what failed
        err.write(f"{PROG}: failed: {type(exc).__name__}: {str(exc)[:500]}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(lean=True))
