"""What the anatomy pane shows for one publishing process, computed in the poll worker: its memory
reconciled against NVML, its step time and op groups, its history, its job's ranks and the advisor's
suggestions, each as text ready to draw (``AnatomyView``). The pane only places these on screen."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text

from anatomy.vocabulary import Component
from tui import format as fmt
from tui.sources.jobs import Job, job_of
from tui.sources.reconcile import PER_PARAMETER, Reconciled, reconcile
from tui.sources.training import LIVE, TrainingProcess
from tui.view.anatomy_text import (
    alert_text,
    gpu_memory_line,
    job_total_cells,
    op_group_cells,
    op_groups_label,
    rank_cells,
    ranks_label,
    reconcile_note,
    suggestion_text,
    timing_text,
    title_text,
)
from tui.view.bars import component_mark

Rows = tuple[tuple[str, tuple[Text, ...]], ...]  # (row key, cells) in the order a table shows them

WAITING_HINT = "\n\nThe pane fills in at its first measured step: memory by component, step time, op groups."
EMPTY_HINT = (
    "No training process publishes its anatomy.\n\n"
    "In the training script:\n"
    "    import anatomy\n"
    "    tracker = anatomy.track(model, optimizer)\n"
    "    with tracker.step(samples=batch_size): ...\n"
    "or pass anatomy.AnatomyCallback() to a Hugging Face Trainer."
)


@dataclass(frozen=True, eq=False)
class AnatomyView:
    """One publishing process as the anatomy pane draws it. Compared by identity: a poll that brings
    nothing new for this process hands the pane the very same view (``anatomy_view``'s ``previous``)."""

    process: TrainingProcess
    # What the view was computed from (process, its job's processes, NVML's bytes, colour off): a view
    # with equal inputs is reused instead of computed again.
    inputs: tuple[object, ...]
    reconciled: Reconciled | None
    job: Job | None
    title: Text
    alert: Text | None
    segments: tuple[tuple[Component, int], ...]  # the stacked bar: bytes at the peak per component
    components: Rows
    reconcile_note: Text
    gpu_memory: Text | None
    timing: Text
    op_groups_label: Text
    op_groups: Rows
    memory_history: tuple[float, ...]
    step_history: tuple[float, ...]
    memory_label: Text
    step_label: Text
    ranks_label: Text
    ranks: Rows
    suggestions: Text

    @property
    def starting(self) -> bool:
        """Said hello but has not finished a measured step yet: nothing to show but that."""
        return self.process.snapshot is None and self.process.state == LIVE


def component_cells(rec: Reconciled, plain: bool = False) -> dict[str, tuple[Text, ...]]:
    """Row key -> cells in the component table's column order (component, at peak, share, max in step,
    B/param, guide). Without an at-peak split (an older hook) the rows are each component's own maximum:
    they go to the Max column and the At peak column shows a dash. ``plain``: no colour, each row marked
    with the letter that draws it in the bar."""
    rows: dict[str, tuple[Text, ...]] = {}
    for row in rec.rows:
        measured = row.bytes is not None
        peak_cell = fmt.fmt_bytes(row.bytes, fmt.UNMEASURED) if rec.at_peak else "—"
        per_param = row.component in PER_PARAMETER
        rows[row.component] = (
            Text.assemble(component_mark(row.component, plain), " ", row.component.label),
            Text(peak_cell, justify="right", style="" if measured and rec.at_peak else "bright_black"),
            Text(fmt.fmt_share(row.share, na="") if measured else "", justify="right"),
            Text(
                fmt.fmt_bytes(row.max_bytes, fmt.UNMEASURED),
                justify="right",
                style="" if row.max_bytes is not None else "bright_black",
            ),
            Text(
                fmt.fmt_bytes_per_param(
                    row.bytes_per_param, "" if row.max_bytes is None or not per_param else fmt.NA
                ),
                justify="right",
            ),
            Text(
                fmt.fmt_bytes_per_param(row.expected_bytes_per_param, "—"),
                justify="right",
                style="bright_black",
            ),
        )
    return rows


def anatomy_view(
    process: TrainingProcess,
    group: Sequence[TrainingProcess],
    nvml_bytes: int | None,
    plain: bool = False,
    previous: AnatomyView | None = None,
) -> AnatomyView:
    """The view of ``process``: ``group``, the processes of its job (the ranks table); ``nvml_bytes``,
    NVML's figure for it (the reconciliation's total); ``plain``, no colour. ``previous`` is returned
    as it is when it was computed from equal inputs."""
    inputs = (process, tuple(group), nvml_bytes, plain)
    if previous is not None and previous.inputs == inputs:
        return previous
    snap = process.snapshot
    rec = reconcile(process.hello, snap, nvml_bytes) if snap is not None else None
    job = job_of(process, list(group))
    ranks: Rows = ()
    if job is not None:
        ranks = (
            *((str(r.pid), rank_cells(r, job, process.pid)) for r in job.ranks),
            ("total", job_total_cells(job)),
        )
    memory = tuple(float(v) for v in process.memory_history)
    steps = tuple(float(v) for v in process.step_time_history)
    # The step's peak, as in the table's total line (tui.sources.training.measured_total).
    memory_label = Text("Peak ", style="bold")
    memory_label.append(fmt.fmt_bytes(memory[-1] if memory else None), style="bright_black")
    step_label = Text("Step time ", style="bold")
    step_label.append(fmt.fmt_seconds(steps[-1] if steps else None), style="bright_black")
    device = process.hello.device if process.hello is not None else None
    return AnatomyView(
        process=process,
        inputs=inputs,
        reconciled=rec,
        job=job,
        title=title_text(process),
        alert=alert_text(process),
        segments=tuple((r.component, r.bytes or 0) for r in rec.rows) if rec is not None else (),
        components=tuple(component_cells(rec, plain).items()) if rec is not None else (),
        reconcile_note=(
            reconcile_note(rec, snap.step if snap is not None else None)
            if rec is not None
            else Text("no snapshot yet", style="bright_black")
        ),
        gpu_memory=gpu_memory_line(rec, nvml_bytes, device) if rec is not None else None,
        timing=timing_text(snap),
        op_groups_label=op_groups_label(snap),
        op_groups=tuple(op_group_cells(snap).items()),
        memory_history=memory,
        step_history=steps,
        memory_label=memory_label,
        step_label=step_label,
        ranks_label=ranks_label(job),
        ranks=ranks,
        suggestions=suggestion_text(snap.suggestions if snap is not None else ()),
    )


def waiting_text(waiting_for: str | None, view: AnatomyView | None) -> Text:
    """What the pane says while it has no anatomy to show: what it waits for (a job known to be starting,
    or ``view``'s process, which said hello but has not measured a step), else how to start publishing."""
    process = view.process if view is not None else None
    if process is not None:
        waiting_for = waiting_for or f"waiting for PID {process.pid} to publish (starting)"
    if waiting_for is None:
        return Text(EMPTY_HINT)
    waiting = Text(waiting_for, style="bold")
    if process is not None and process.hello is not None:
        waiting.append("\n")
        waiting.append(Text(f"PID {process.pid} · {process.hello.model_class}", style="cyan"))
    waiting.append(WAITING_HINT, style="bright_black")
    return waiting
