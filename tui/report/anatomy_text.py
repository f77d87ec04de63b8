"""Plain-text anatomy of each publishing training process, printed by ``anatomy-top --once`` under the
nvidia-smi tables: the reconciled memory components, the step split and throughput, op groups as share
of FLOPs next to share of time, the advisor's suggestions, and an OOM marking.

Every figure goes through ``tui.format`` so it reads exactly as on the interactive screen. Text that came
from a socket or a file (model class, OOM message, suggestions) has control characters replaced so it
cannot drive the terminal.
"""

from __future__ import annotations

from collections.abc import Sequence

from anatomy.protocol import Snapshot
from anatomy.vocabulary import Component, OpGroup
from tui import format as fmt
from tui import sanitize
from tui.sources.anatomy_source import EXITED, LIVE, OOM, TrainingProcess
from tui.sources.jobs import Job, jobs_of
from tui.sources.model import MachineSnapshot
from tui.sources.reconcile import (
    PER_PARAMETER,
    TOTAL_NVML,
    TOTAL_PEAK,
    TOTAL_RESERVED,
    Reconciled,
    ReconciledRow,
    nvml_process_bytes,
    reconcile,
    total_line,
)

RULE = "-" * 91


JOB_COLUMNS = (Component.WEIGHTS, Component.OPTIMIZER_STATES, Component.GRADIENTS, Component.ACTIVATIONS)
COMPONENT_LABELS = {
    Component.WEIGHTS: "Weights",
    Component.OPTIMIZER_STATES: "Optim.",
    Component.GRADIENTS: "Grads",
    Component.ACTIVATIONS: "Activ.",
}


def clean(text: object) -> str:
    """Untrusted text safe to print on one line: the one sanitiser's visible escapes (``\\x1b``, ``\\n``)."""
    return sanitize.clean(str(text))


def _title(proc: TrainingProcess) -> str:
    hello = proc.hello
    parts = [f"Training process {proc.pid}"]
    if hello is not None:
        parts.append(clean(hello.model_class))
        parts.append(
            fmt.fmt_params(hello.parameter_count, hello.trainable_parameter_count, hello.weight_quantization)
        )
        parts.append(clean(hello.device))
        parts.append(clean(hello.precision))
        opt = clean(hello.optimizer)
        if hello.optimizer_class:
            opt += f" ({clean(hello.optimizer_class)})"
        parts.append(opt)
        if hello.world_size and hello.world_size > 1:
            parts.append(f"rank {hello.rank if hello.rank is not None else '?'}/{hello.world_size}")
    if proc.snapshot is not None:
        parts.append(f"step {proc.snapshot.step}")
    parts.append(f"[{proc.state}]")
    return "  ".join(parts)


def _total_caption(rec: Reconciled, step: int | None = None) -> str:
    if rec.at_peak:
        verdict = "" if rec.reconciles else f" ({clean(rec.note or 'does not add up')})"
        where = " (glibc heap in use)" if rec.total_source == TOTAL_PEAK and not rec.on_cuda else ""
        return f"Memory: {clean(total_line(rec, step))}{where}{verdict}"
    total = fmt.fmt_bytes(rec.total)
    if rec.total_source == TOTAL_NVML:
        what = f"NVML per-process memory {total}"
    elif rec.total_source == TOTAL_RESERVED:
        what = f"allocator reserved {total}"
    elif rec.total_source == TOTAL_PEAK:
        what = f"measured step peak {total}"
    else:
        what = f"sum of measured components {total}"
    verdict = "components add up exactly" if rec.reconciles else clean(rec.note or "does not add up")
    return f"Memory: {what} ({verdict})"


def _no_bpp(row: ReconciledRow) -> str:
    """What the B/param column says without a figure: '-' where the component is not per parameter
    (CUDA context, allocator cache, unattributed ...), N/A where it is but was not measured."""
    return fmt.NA if row.component in PER_PARAMETER else "-"


def memory_table(rec: Reconciled, step: int | None = None) -> list[str]:
    """Component | At peak | Share | Max in step | Bytes/param | Guide, then the total."""
    lines = [
        _total_caption(rec, step),
        f"  {'Component':<24}{'At peak':>12}{'Share':>8}{'Max in step':>13}{'B/param':>10}{'Guide':>8}",
    ]
    for row in rec.rows:
        at_peak = fmt.fmt_bytes(row.bytes, na=fmt.UNMEASURED) if rec.at_peak else "-"
        lines.append(
            f"  {row.label:<24}{at_peak:>12}"
            f"{fmt.fmt_share(row.share):>8}"
            f"{fmt.fmt_bytes(row.max_bytes, na=fmt.UNMEASURED):>13}"
            f"{fmt.fmt_bytes_per_param(row.bytes_per_param, na=_no_bpp(row)):>10}"
            f"{fmt.fmt_bytes_per_param(row.expected_bytes_per_param, na='-'):>8}"
        )
    unexplained = rec.unexplained
    if unexplained is not None and unexplained > 0:
        lines.append(f"  {'(not accounted for)':<24}{fmt.fmt_bytes(unexplained):>12}")
    lines.append(f"  {'Total':<24}{fmt.fmt_bytes(rec.total):>12}")
    return lines


def step_lines(snapshot: Snapshot) -> list[str]:
    t = snapshot.timing
    split = []
    for name, value in (("forward", t.forward_s), ("backward", t.backward_s), ("optimizer", t.optimizer_s)):
        share = value / t.step_s if value is not None and t.step_s else None
        split.append(f"{name} {fmt.fmt_seconds(value)} ({fmt.fmt_share(share, decimals=0)})")
    accum = f", {snapshot.grad_accum_steps} accumulation steps" if snapshot.grad_accum_steps > 1 else ""
    mfu = fmt.fmt_share(snapshot.mfu) if snapshot.mfu is not None else fmt.NA
    return [
        f"Step: {fmt.fmt_seconds(t.step_s)}{accum} = " + ", ".join(split),
        f"Throughput: {fmt.fmt_rate(t.samples_per_s, 'samples')}, {fmt.fmt_rate(t.tokens_per_s, 'tokens')},"
        f" achieved {fmt.fmt_tflops(snapshot.achieved_tflops)}, MFU {mfu}",
    ]


def op_group_lines(snapshot: Snapshot) -> list[str]:
    groups = snapshot.op_groups
    if not groups:
        return ["Op groups: not sampled yet"]
    total_flops = sum(s.flops for s in groups.values() if s.flops is not None)
    total_time = sum(s.time_s for s in groups.values() if s.time_s is not None)
    sampled = f" (sampled on step {snapshot.op_groups_step})" if snapshot.op_groups_step is not None else ""
    lines = [f"Op groups{sampled}: share of FLOPs vs share of time"]
    lines.append(f"  {'Group':<28}{'FLOPs':>10}{'Time':>10}")
    for group in OpGroup:
        stat = groups.get(group)
        if stat is None:
            continue
        flops = stat.flops / total_flops if stat.flops is not None and total_flops > 0 else None
        share_t = stat.time_s / total_time if stat.time_s is not None and total_time > 0 else None
        lines.append(f"  {group.label:<28}{fmt.fmt_share(flops):>10}{fmt.fmt_share(share_t):>10}")
    return lines


def suggestion_lines(snapshot: Snapshot) -> list[str]:
    if not snapshot.suggestions:
        return []
    lines = ["Suggestions:"]
    for i, s in enumerate(snapshot.suggestions, 1):
        extras = []
        if s.saving_bytes is not None:
            extras.append(f"saves {fmt.fmt_bytes(s.saving_bytes)}")
        if s.speed_factor is not None:
            extras.append(f"speed x{s.speed_factor:.2f}")
        extras.append(clean(s.source))
        lines.append(f"  {i}. {clean(s.title)} ({', '.join(extras)})")
        if s.detail:
            lines.append(f"     {clean(s.detail)}")
    return lines


def render_process(proc: TrainingProcess, machine: MachineSnapshot | None = None) -> str:
    lines = [_title(proc)]
    if proc.state == OOM:
        lines.append(f"OUT OF MEMORY: {clean(proc.oom or 'out of memory')} (last anatomy before the crash)")
    elif proc.state == EXITED:
        lines.append("The process stopped publishing; last anatomy shown.")
    if proc.error:
        lines.append(f"Error: {clean(proc.error)}")
    snap = proc.snapshot
    if snap is None:
        if proc.state != OOM:
            lines.append("Waiting for the first snapshot.")
        return "\n".join(lines)
    nvml = nvml_process_bytes(proc.pid, machine.processes) if machine is not None else None
    rec = reconcile(proc.hello, snap, nvml)
    lines += memory_table(rec, snap.step)
    if snap.peak_phase and not rec.at_peak:  # with the split, the total line says where the peak was
        lines.append(f"Peak during: {clean(snap.peak_phase)}")
    lines += step_lines(snap)
    lines += op_group_lines(snap)
    lines += suggestion_lines(snap)
    return "\n".join(lines)


def render_training_text(processes: Sequence[TrainingProcess], machine: MachineSnapshot | None = None) -> str:
    """The anatomy section of ``--once``; empty when nothing publishes."""
    if not processes:
        return ""
    blocks = [render_process(p, machine) for p in processes]
    blocks += [render_job(job) for job in jobs_of(list(processes))]
    return RULE + "\n" + ("\n" + RULE + "\n").join(blocks) + "\n" + RULE


def render_job(job: Job) -> str:
    """One multi-rank job: a row per rank (memory by component, step time, the slowest marked) and the
    job's total on this node."""
    head = f"Job {clean(job.model_class)}: {job.ranks_seen} of {job.world_size} ranks on this node"
    if job.run_id:
        head += f" (run {clean(job.run_id)})"
    lines = [head]
    if job.slowest_rank is not None:
        verdict = "the straggler" if job.straggler else "the slowest"
        lines.append(f"Rank {job.slowest_rank} is {verdict} (marked *).")
    header = f"{'Rank':>5} {'PID':>8} {'Step time':>10} {'Peak':>10}" + "".join(
        f" {COMPONENT_LABELS[key]:>10}" for key in JOB_COLUMNS
    )
    lines.append(header)
    for row in job.ranks:
        mark = "*" if row.rank is not None and row.rank == job.slowest_rank else " "
        step = fmt.fmt_seconds(row.step_s) if row.state is LIVE else row.state.upper()
        rank = row.rank if row.rank is not None else "?"
        line = f"{rank:>5} {row.pid:>8} {step:>9}{mark} {fmt.fmt_bytes(row.peak):>10}"
        line += "".join(f" {fmt.fmt_bytes(row.memory.get(key)):>10}" for key in JOB_COLUMNS)
        lines.append(line)
    total = f"{'total':>5} {'':>8} {'':>10} {fmt.fmt_bytes(job.total_peak):>10}"
    total += "".join(f" {fmt.fmt_bytes(job.total_memory.get(key)):>10}" for key in JOB_COLUMNS)
    lines.append(total)
    return "\n".join(lines)
