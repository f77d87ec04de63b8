"""Text blocks of the anatomy pane (title, alert, op groups, timing, ranks, suggestions), built from the
protocol's objects. Pure functions: every untrusted string (model class, OOM text, advisor text) is
wrapped in ``Text`` and never parsed as markup."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from anatomy.protocol import OpGroupStat, Snapshot, Suggestion
from anatomy.vocabulary import Component, OpGroup, PublisherState, Source
from tui import format as fmt
from tui.sources.anatomy_source import TrainingProcess
from tui.sources.jobs import Job, RankRow
from tui.sources.reconcile import SUM_OF_ROWS, TOTAL_NVML, TOTAL_PEAK, TOTAL_RESERVED, Reconciled, total_line
from tui.view.bars import meter

# The components a job's rank table shows per rank (the pane's component table has them all).
JOB_COMPONENTS = (Component.WEIGHTS, Component.OPTIMIZER_STATES, Component.GRADIENTS, Component.ACTIVATIONS)
STATE_BADGES: dict[PublisherState, tuple[str, str]] = {
    PublisherState.LIVE: ("LIVE", "bold green"),
    PublisherState.OOM: ("OOM", "bold reverse red"),
    PublisherState.EXITED: ("EXITED", "bold bright_black"),
    PublisherState.ERROR: ("ERROR", "bold yellow"),
}
# Keyed by str: a suggestion's source may be a word this monitor does not know (a newer hook's).
SOURCE_STYLES: dict[str, str] = {
    Source.MEASURED: "green",
    Source.PREDICTED: "yellow",
    Source.GUIDE: "cyan",
}
_TOTAL_LABELS = {
    TOTAL_NVML: "NVML's figure for this process",
    TOTAL_RESERVED: "the allocator's reserved bytes",
    TOTAL_PEAK: "the step's measured peak",
}


def title_text(process: TrainingProcess, stale_s: float | None = None) -> Text:
    """Badge, PID, model, set-up and step; ``stale_s`` (seconds without a new snapshot from a live
    process, given only past a threshold) flags a training loop that stalled or hangs."""
    hello, snap = process.hello, process.snapshot
    badge, style = STATE_BADGES.get(process.state, (process.state.upper(), "bold"))
    text = Text()
    text.append(f" {badge} ", style=style)
    text.append(f" PID {process.pid}", style="bold")
    if hello is not None:
        text.append("  ")
        text.append(Text(hello.model_class, style="bold cyan"))
        if hello.world_size and hello.world_size > 1 and hello.rank is not None:
            text.append(f"  rank {hello.rank}/{hello.world_size}", style="cyan")
        details = [
            fmt.fmt_params(hello.parameter_count, hello.trainable_parameter_count, hello.weight_quantization),
            hello.precision,
            hello.optimizer,
            hello.device,
        ]
        text.append("\n")
        text.append(Text(" · ".join(details), style="bright_black"))
    if snap is not None:
        text.append(f" · step {snap.step}", style="bright_black")
    if stale_s is not None:
        text.append_text(stale_text(stale_s))
    return text


def stale_text(stale_s: float) -> Text:
    """The title's last line when a live process has sent nothing new for ``stale_s`` seconds."""
    return Text(f"\nno new snapshot for {fmt.fmt_duration(stale_s)}", style="bold yellow")


def alert_text(process: TrainingProcess) -> Text | None:
    """The OOM exception, the reason a reader was dropped, or the hook's own degradation."""
    if process.state is PublisherState.OOM or process.oom:
        text = Text("OOM ", style="bold reverse red")
        text.append(" ")
        text.append(Text(process.oom or "out of memory", style="red"))
        text.append("\nlast anatomy before the process died", style="bright_black")
        return text
    if process.state is PublisherState.EXITED:
        return Text("process exited — its last anatomy is shown", style="bright_black")
    if process.error:
        text = Text("error: ", style="bold yellow")
        text.append(Text(process.error))
        return text
    return None


def gpu_memory_line(rec: Reconciled, nvml_bytes: int | None, device: str | None) -> Text | None:
    """One line on why NVML's GPU memory for the process differs from the anatomy's peak."""
    if nvml_bytes is None:
        return None
    if not rec.on_cuda:
        return Text(
            f"GPU MEM {fmt.fmt_bytes(nvml_bytes)} (NVML) is not in these rows: the job trains on "
            f"{device or 'the CPU'}",
            style="bright_black",
        )
    if rec.total_source == TOTAL_NVML:
        return Text(
            "NVML counts the whole process: CUDA context, allocator cache, tensors", style="bright_black"
        )
    return None


def reconcile_note(rec: Reconciled, step: int | None = None) -> Text:
    text = Text()
    if rec.at_peak:
        line = total_line(rec, step)
        head, sep, rest = line.partition(SUM_OF_ROWS)
        # What follows the sum (peak allocated, split traced at step N) on a line of its own: each
        # line fits the pane's width side by side.
        if rest.startswith(" · "):
            rest = "\n" + rest[3:]
        elif not sep:
            head = head.replace(" · ", "\n", 1)
        text.append(head, style="bold")
        if sep:
            text.append(sep + " ✓", style="green")
        text.append(rest, style="bright_black")
        if rec.reconciles and rec.total_source == TOTAL_PEAK and not rec.on_cuda:
            text.append(
                "\nglibc heap in use at the peak: all the process malloc'd, not freed", style="bright_black"
            )
        elif not rec.reconciles and rec.note:
            text.append("\n")
            text.append(Text(rec.note, style="yellow"))
        return text
    text.append("Total ", style="bright_black")
    text.append(fmt.fmt_bytes(rec.total), style="bold")
    if rec.reconciles:
        text.append(f"  ✓ rows sum to {_TOTAL_LABELS.get(rec.total_source, 'the total')}", style="green")
    elif rec.note:
        text.append("  ")
        text.append(Text(rec.note, style="yellow"))
    return text


def _shares(groups: dict[OpGroup, OpGroupStat], attr: str) -> dict[OpGroup, float | None]:
    values = {k: getattr(v, attr) for k, v in groups.items()}
    total = sum(v for v in values.values() if v is not None)
    return {k: (v / total if v is not None and total > 0 else None) for k, v in values.items()}


def op_group_cells(snapshot: Snapshot | None, width: int = 8) -> dict[str, tuple[Text, Text, Text]]:
    """Row key (OpGroup value) -> (label, FLOPs share meter, time share meter)."""
    groups = snapshot.op_groups if snapshot is not None else None
    if not groups:
        return {}
    flops, times = _shares(groups, "flops"), _shares(groups, "time_s")
    rows: dict[str, tuple[Text, Text, Text]] = {}
    for group in OpGroup:
        if group not in groups:
            continue
        f, t = flops.get(group), times.get(group)
        f_cell = meter(f, width, "blue")
        f_cell.append(f" {fmt.fmt_share(f):>6}")
        t_cell = meter(t, width, "magenta")
        t_cell.append(f" {fmt.fmt_share(t):>6}")
        rows[group] = (Text(group.label), f_cell, t_cell)
    return rows


def op_groups_label(snapshot: Snapshot | None) -> Text:
    text = Text("Op groups", style="bold")
    if snapshot is None or not snapshot.op_groups:
        text.append("  not sampled yet", style="bright_black")
    elif snapshot.op_groups_step is not None:
        text.append(f"  sampled at step {snapshot.op_groups_step}", style="bright_black")
    return text


def timing_text(snapshot: Snapshot | None) -> Text:
    text = Text()
    if snapshot is None:
        return Text("no step measured yet", style="bright_black")
    timing = snapshot.timing
    text.append("Step ", style="bright_black")
    text.append(fmt.fmt_seconds(timing.step_s), style="bold")
    parts = (("fwd", timing.forward_s), ("bwd", timing.backward_s), ("opt", timing.optimizer_s))
    for name, value in parts:
        text.append(f"  {name} ", style="bright_black")
        text.append(fmt.fmt_seconds(value))
        if value is not None and timing.step_s:
            text.append(f" ({fmt.fmt_share(value / timing.step_s, 0)})", style="bright_black")
    text.append("\n")
    text.append(fmt.fmt_rate(timing.samples_per_s, "samples"))
    text.append(" · ", style="bright_black")
    text.append(fmt.fmt_rate(timing.tokens_per_s, "tokens"))
    text.append(" · MFU ", style="bright_black")
    text.append(fmt.fmt_share(snapshot.mfu), style="bold")
    if snapshot.achieved_tflops is not None:
        text.append(f" ({fmt.fmt_tflops(snapshot.achieved_tflops)})", style="bright_black")
    if snapshot.peak_bytes is not None and snapshot.at_peak is None:  # else the memory total line says it
        text.append("\nPeak ", style="bright_black")
        text.append(fmt.fmt_bytes(snapshot.peak_bytes), style="bold")
        if snapshot.peak_phase:
            text.append(f" in {snapshot.peak_phase}", style="bright_black")
    if snapshot.grad_accum_steps > 1:
        text.append(f" · grad accumulation ×{snapshot.grad_accum_steps}", style="bright_black")
    return text


def suggestion_text(suggestions: Sequence[Suggestion]) -> Text:
    if not suggestions:
        return Text("no suggestions", style="bright_black")
    text = Text()
    for i, s in enumerate(suggestions, start=1):
        if i > 1:
            text.append("\n")
        text.append(f"{i}. ", style="bold")
        text.append(Text(s.title, style="bold"))
        if s.saving_bytes is not None:
            # The saving of a technique not yet applied is an estimate; a measured one (a leak) is not.
            about = "" if s.source == Source.MEASURED else "~"
            text.append(" — saves ", style="bright_black")
            text.append(f"{about}{fmt.fmt_bytes(s.saving_bytes)}", style="green")
        if s.speed_factor is not None:
            text.append(f" · ×{s.speed_factor:.2f} speed", style="bright_black")
        text.append(" · ", style="bright_black")
        text.append(Text(s.source, style=SOURCE_STYLES.get(s.source, "")))
        if s.detail:
            text.append("\n   ")
            text.append(Text(s.detail, style="bright_black"))
    return text


def ranks_label(job: Job | None) -> Text:
    """The ranks section's title: the job, how many ranks publish, and its straggler if any."""
    text = Text("Ranks", style="bold")
    if job is None:
        return text
    name = f" · {job.model_class} · {job.ranks_seen}/{job.world_size} ranks"
    text.append(name + (f" · run {job.run_id}" if job.run_id else ""), style="bright_black")
    if job.straggler and job.slowest_rank is not None:
        text.append(f" · rank {job.slowest_rank} is the straggler", style="bold red")
    return text


def rank_cells(row: RankRow, job: Job, selected_pid: int | None) -> tuple[Text, ...]:
    """One rank of a job: its step time (the slowest highlighted), its peak and the components it holds."""
    rank = Text(justify="right")
    if row.pid == selected_pid:
        rank.append("▶ ", style="bold cyan")
    rank.append(str(row.rank) if row.rank is not None else fmt.NA)
    slowest = row.rank is not None and row.rank == job.slowest_rank
    if row.state is not PublisherState.LIVE:  # exited, died of OOM or failed: its state where its pace was
        badge, style = STATE_BADGES.get(row.state, (row.state.upper(), "bold"))
        step = Text(badge, style=style, justify="right")
    else:
        step_style = ("bold red" if job.straggler else "bold yellow") if slowest else ""
        step = Text(
            fmt.fmt_seconds(row.step_s) + (" ▲" if slowest else "  "), style=step_style, justify="right"
        )
    return (
        rank,
        Text(str(row.pid), justify="right"),
        step,
        Text(fmt.fmt_bytes(row.peak), justify="right"),
        *(Text(fmt.fmt_bytes(row.memory.get(key)), justify="right") for key in JOB_COMPONENTS),
    )


def job_total_cells(job: Job) -> tuple[Text, ...]:
    """The job's total: every rank's peak and components summed (what the job holds on this node)."""
    total = job.total_memory
    return (
        Text("Σ", style="bold", justify="right"),
        Text(""),
        Text(""),
        Text(fmt.fmt_bytes(job.total_peak), style="bold", justify="right"),
        *(Text(fmt.fmt_bytes(total.get(key)), style="bold", justify="right") for key in JOB_COMPONENTS),
    )
