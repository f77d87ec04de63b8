"""`anatomy-top plan --like PID`: plan the job a running process is training, and set the plan beside
what that process's hook measured, component by component.

The process is found as the monitor finds it (the runtime directory of :mod:`anatomy.rundir`, its
sockets through :func:`anatomy.protocol.discover`, read with :class:`anatomy.protocol.Reader`). Its
hello carries what a plan needs (:mod:`anatomy.plan.like_settings` reads it): the Hugging Face config
(``model_config``), the first batch's shape and its labels', the precision, the optimizer, the device,
under torchrun the world size, and a LoRA / QLoRA job's adapter and quantized base; whether the job
shards (FSDP2: the snapshot has all-gathered parameters) or replicates (DDP: it has communication
buffers) is read from its snapshot. Options the hook cannot see (checkpointing, padding, the loop) are
the command line's.

Stdlib until the plan itself runs (the monitor runs this module in a subprocess: it never imports torch).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from anatomy.plan.like_settings import like_notes, settings_like
from anatomy.plan.settings import PlanError, PlanSettings, Target
from anatomy.units import fmt_bytes
from anatomy.vocabulary import Component

if TYPE_CHECKING:
    from pathlib import Path

    from anatomy.protocol import Hello, Snapshot

WAIT_S = 10.0  # for the process's hello and a measured step
COMPARED = (
    Component.WEIGHTS,
    Component.UNSHARDED_PARAMETERS,
    Component.OPTIMIZER_STATES,
    Component.GRADIENTS,
    Component.ACTIVATIONS,
    Component.COMMUNICATION_BUFFERS,
    Component.TEMPORARIES,
)
# What the process holds besides the step's tensors: not planned, so left out of the compared peak. The
# hook's inputs (the batch's storages saved for backward) are the step's: a plan counts them as activations.
OUTSIDE_TENSORS = (
    Component.RUNTIME,
    Component.UNATTRIBUTED,
    Component.CUDA_CONTEXT,
    Component.ALLOCATOR_CACHE,
)


@dataclass
class Measured:
    hello: Hello
    snapshot: Snapshot


def read_process(pid: int, directory: Path | None = None, wait_s: float = WAIT_S) -> Measured:
    """The hello and latest measured snapshot of the training process ``pid`` (PlanError: none)."""
    from anatomy.protocol import ProtocolError, Reader, discover, pid_from_path, runtime_dir, untrusted_reason

    where = directory if directory is not None else runtime_dir()
    reason = untrusted_reason(where)
    if reason is not None:
        raise PlanError(f"not reading {where}: {reason}")
    sockets = [p for p in discover(where, clean_stale=False) if pid_from_path(p) == pid]
    if not sockets:
        raise PlanError(f"process {pid} publishes no anatomy in {where} (is it training with anatomy.track?)")
    try:
        reader = Reader(sockets[0])
    except OSError as exc:
        raise PlanError(f"cannot connect to process {pid}: {exc.strerror or exc}") from None
    try:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not reader.closed:
            try:
                reader.poll()
            except ProtocolError as exc:
                raise PlanError(f"process {pid} sent something unreadable: {exc}") from None
            snap = reader.snapshot
            if reader.hello is not None and snap is not None and snap.peak_bytes is not None:
                return Measured(reader.hello, snap)
            time.sleep(0.05)
    finally:
        reader.close()
    raise PlanError(f"process {pid} published no measured step within {wait_s:.0f} s")


@dataclass
class Comparison:
    label: str
    rows: list[tuple[str, int | None, int | None]]  # (what, planned, measured)
    notes: list[str]


def compare(pid: int, base: PlanSettings, directory: Path | None = None) -> Comparison:
    measured = read_process(pid, directory)
    config, settings = settings_like(measured, base)
    from anatomy.plan.planner import Planner

    hello, snap = measured.hello, measured.snapshot
    planner = Planner(config, settings.task, name=f"PID {pid}")
    gpu_bytes = hello.device_memory_bytes if settings.target is Target.CUDA else None
    planner.check(settings, None, gpu_bytes)
    result = planner.plan(settings, None, gpu_bytes)
    components: dict[Component, int | None] = dict(result.components)
    peak = result.peak_bytes
    kind = "single process"
    if settings.fsdp or settings.ddp:
        from anatomy.plan.sharding import rank_plan

        kind_name = "fsdp" if settings.fsdp else "ddp"
        rp = rank_plan(planner, settings, kind_name, (settings.fsdp or settings.ddp)[0], None)
        components, peak = rp.components, rp.peak_bytes
        kind = f"{'FSDP2' if settings.fsdp else 'DDP'} rank {hello.rank} of {hello.world_size}"
    rows: list[tuple[str, int | None, int | None]] = []
    inputs = snap.memory.get(Component.INPUTS)
    for comp in COMPARED:
        planned, got = components.get(comp), snap.memory.get(comp)
        if planned is None and got is None:
            continue
        if comp is Component.ACTIVATIONS and got is not None and inputs:
            got += inputs
        rows.append((comp.label, planned, got))
    measured_peak = None
    if snap.peak_bytes is not None and snap.at_peak is not None:
        measured_peak = snap.peak_bytes - sum(snap.at_peak.get(c) or 0 for c in OUTSIDE_TENSORS)
    rows.append(("Peak (tensors)", peak, measured_peak))
    kept = result.outputs_kept_bytes
    w = result.workload
    label = (
        f"PID {pid}: {model_named(hello)} ({result.task.value}), {w.describe()}, {hello.precision}, "
        f"{hello.optimizer_class or hello.optimizer}, {hello.device}, {kind}; measured at step {snap.step}"
    )
    notes = [
        "planned as the hello describes it; what the hook cannot see is the command line's: "
        + ("padded batches" if settings.padded else "no attention-mask padding")
        + (", gradient checkpointing" if settings.gradient_checkpointing else "")
        + f", {'a plain loop' if settings.keep_outputs else 'the Trainer loop'}",
        "peak (tensors): the measured peak without runtime, unattributed, CUDA context and allocator "
        "cache, which a plan does not model; on CPU the hook reads the heap at phase boundaries, so a "
        "peak inside a phase can be missed",
        *(
            [
                f"activations measured: the hook's activations and its inputs ({fmt_bytes(inputs)}: the "
                "batch's storages saved for backward, which a plan counts as activations)"
            ]
            if inputs
            else []
        ),
        # held outputs under 1% of the peak (a classifier's logits) are not worth a note
        *like_notes(hello, settings, result.trainable_parameters, kept if 100 * kept >= peak else 0),
    ]
    return Comparison(label, rows, notes)


def model_named(hello: Hello) -> str:
    """The hello's model class, and a PEFT model's base class with its adapter."""
    base = hello.lora.base_model_class if hello.lora is not None else ""
    return f"{hello.model_class} of {base} + LoRA" if base else hello.model_class


def error_pct(planned: int | None, measured: int | None) -> str:
    if planned is None or measured is None:
        return "-"
    if measured == 0:
        return "exact" if planned == 0 else "-"
    pct = 100.0 * (planned - measured) / measured
    return "exact" if planned == measured else f"{pct:+.1f}%"


def render(cmp: Comparison, out: TextIO) -> None:
    from anatomy.plan.report import INDENT, wrap

    out.write(wrap(f"Plan vs measured — {cmp.label}", ""))
    out.write("\n")
    out.write(f"{INDENT}{'Component':<24}{'planned':>12}{'measured':>12}{'error':>10}\n")
    for what, planned, got in cmp.rows:
        p = fmt_bytes(planned) if planned is not None else "-"
        m = fmt_bytes(got) if got is not None else "-"
        out.write(f"{INDENT}{what:<24}{p:>12}{m:>12}{error_pct(planned, got):>10}\n")
    for note in cmp.notes:
        out.write(wrap(f"note: {note}", hanging="      "))


def to_json(cmp: Comparison) -> dict[str, Any]:
    return {
        "label": cmp.label,
        "rows": [
            {"component": what, "planned": p, "measured": m, "error": error_pct(p, m)}
            for what, p, m in cmp.rows
        ],
        "notes": cmp.notes,
    }


def run(pid: int, base: PlanSettings, as_json: bool, out: TextIO) -> None:
    cmp = compare(pid, base)
    if as_json:
        out.write(json.dumps(to_json(cmp), indent=2) + "\n")
    else:
        render(cmp, out)


__all__ = ["Comparison", "compare", "error_pct", "read_process", "render", "run", "settings_like"]
