"""The anatomy side: for one training process, where its memory goes (reconciled against NVML), where its
time goes, its history, its ranks, and the advisor's suggestions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Sparkline, Static

from tui import format as fmt
from tui.sources.anatomy_source import TrainingProcess
from tui.sources.jobs import job_of
from tui.sources.reconcile import PER_PARAMETER, Reconciled, reconcile
from tui.widgets.anatomy_text import (
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
from tui.widgets.bars import component_mark
from tui.widgets.line_table import LineTable
from tui.widgets.stacked_bar import StackedBar
from tui.widgets.text_static import TextStatic

COMPONENT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("component", "  Component"),
    ("bytes", "At peak"),  # held at the moment of the step's peak: the bar, the share
    ("share", "Share"),
    ("max", "Max in step"),  # the component at its own maximum: bytes/param
    ("bpp", "B/param"),
    ("expected", "Guide"),
)
OPGROUP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("group", "Op group"),
    ("flops", "FLOPs share"),
    ("time", "Time share"),
)
RANK_COLUMNS: tuple[tuple[str, str], ...] = (
    ("rank", "Rank"),
    ("pid", "PID"),
    ("step_s", "Step time"),
    ("peak", "Peak"),
    ("weights", "Weights"),
    ("optimizer_states", "Optim."),
    ("gradients", "Grads"),
    ("activations", "Activ."),
)
RANK_RIGHT = ("rank", "pid", "step_s", "peak", "weights", "optimizer_states", "gradients", "activations")

WAITING_HINT = "\n\nThe pane fills in at its first measured step: memory by component, step time, op groups."
EMPTY_HINT = (
    "No training process publishes its anatomy.\n\n"
    "In the training script:\n"
    "    import anatomy\n"
    "    tracker = anatomy.track(model, optimizer)\n"
    "    with tracker.step(samples=batch_size): ...\n"
    "or pass anatomy.AnatomyCallback() to a Hugging Face Trainer."
)


def component_cells(rec: Reconciled, plain: bool = False) -> dict[str, tuple[Text, ...]]:
    """Row key -> cells in COMPONENT_COLUMNS order. Without an at-peak split (an older hook) the rows
    are each component's own maximum: they go to the Max column and the At peak column shows a dash.
    ``plain``: no colour, each row marked with the letter that draws it in the bar."""
    rows: dict[str, tuple[Text, ...]] = {}
    for row in rec.rows:
        measured = row.bytes is not None
        peak_cell = fmt.fmt_bytes(row.bytes, fmt.UNMEASURED) if rec.at_peak else "—"
        per_param = row.component in PER_PARAMETER
        rows[row.component.value] = (
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


def _table(columns: Sequence[tuple[str, str]], right: Sequence[str] = (), **kwargs: Any) -> LineTable:
    return LineTable([(key, label, "right" if key in right else "left") for key, label in columns], **kwargs)


class AnatomyPane(VerticalScroll):
    """``show(process, group, nvml_bytes)``; ``process`` None shows how to start publishing."""

    can_focus = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "l",
            "plan_like",
            "Plan vs measured",
            id="plan-like",
            tooltip="anatomy pane: the job's plan vs what was measured (plan --like)",
        ),
    ]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.process: TrainingProcess | None = None
        self.reconciled: Reconciled | None = None
        self.hint: str | None = None
        # Set by the app while a training job it knows of is starting: said instead of the how-to.
        self.waiting_for: str | None = None

    @property
    def plain(self) -> bool:
        return bool(getattr(getattr(self.app, "caps", None), "plain", False))

    def _update(self, selector: str, content: Text | str) -> None:
        self.query_one(selector, TextStatic).show_text(content)

    def compose(self) -> ComposeResult:
        yield TextStatic(Text(EMPTY_HINT), id="anatomy-empty")
        with Vertical(id="anatomy-body"):
            yield TextStatic(id="anatomy-hint")
            yield TextStatic(id="anatomy-title")
            yield TextStatic(id="anatomy-alert")
            yield StackedBar(id="anatomy-bar")
            yield _table(
                COMPONENT_COLUMNS,
                ("bytes", "share", "max", "bpp", "expected"),
                id="anatomy-components",
                gap=1,  # six columns in the pane's 74 cells side by side at 160 columns
            )
            yield TextStatic(id="anatomy-reconcile")
            yield TextStatic(id="anatomy-gpu-memory")
            yield Static(Text("Step time", style="bold"), classes="section")
            yield TextStatic(id="anatomy-timing")
            yield TextStatic(id="anatomy-opgroups-label", classes="section")
            yield _table(OPGROUP_COLUMNS, id="anatomy-opgroups")
            with Horizontal(id="anatomy-history"):
                with Vertical(classes="spark"):
                    yield TextStatic(id="spark-memory-label", classes="spark-label")
                    yield Sparkline([], id="spark-memory")
                with Vertical(classes="spark"):
                    yield TextStatic(id="spark-step-label", classes="spark-label")
                    yield Sparkline([], id="spark-step")
            yield TextStatic(id="anatomy-ranks-label", classes="section ranks")
            # one cell between columns: a job's table fits the side-by-side pane (74 columns)
            yield _table(RANK_COLUMNS, RANK_RIGHT, id="anatomy-ranks", classes="ranks", gap=1)
            yield Static(Text("Suggestions", style="bold"), classes="section")
            yield TextStatic(id="anatomy-suggestions")

    def on_mount(self) -> None:
        self.show(None, (), None)

    def action_plan_like(self) -> None:
        """The plan of the shown process's job beside what its hook measured (in a subprocess)."""
        from tui.screens.plan_like import PlanLikeScreen

        process = self.process
        if process is None or process.pid <= 0:
            from tui.notices import tell

            tell(self.app, "no training process shown: nothing to plan", "warning", 3)
            return
        directory = getattr(getattr(self.app, "anatomy_source", None), "directory", None)
        self.app.push_screen(PlanLikeScreen(process.pid, directory))

    def show(
        self,
        process: TrainingProcess | None,
        group: Sequence[TrainingProcess],
        nvml_bytes: int | None,
        hint: str | None = None,
        stale_s: float | None = None,
    ) -> None:
        self.process = process
        self.hint = hint
        # A job that said hello but has not finished a measured step yet has nothing to show but that.
        starting = process is not None and process.snapshot is None and process.state == "live"
        self.set_class(process is None or starting, "-empty")
        if process is None or starting:
            self.reconciled = None
            waiting_for = self.waiting_for
            if starting and process is not None:
                waiting_for = waiting_for or f"waiting for PID {process.pid} to publish (starting)"
            if waiting_for is not None:
                waiting = Text(waiting_for, style="bold")
                if process is not None and process.hello is not None:
                    waiting.append("\n")
                    waiting.append(Text(f"PID {process.pid} · {process.hello.model_class}", style="cyan"))
                waiting.append(WAITING_HINT, style="bright_black")
                self._update("#anatomy-empty", waiting)
            else:
                self._update("#anatomy-empty", Text(EMPTY_HINT))
            return
        snap = process.snapshot
        hint_widget = self.query_one("#anatomy-hint", TextStatic)
        hint_widget.display = hint is not None
        self._update("#anatomy-hint", Text(hint or "", style="italic bright_black"))
        self._update("#anatomy-title", title_text(process, stale_s))
        alert = alert_text(process)
        alert_widget = self.query_one("#anatomy-alert", TextStatic)
        alert_widget.display = alert is not None
        alert_widget.set_class(process.state == "oom", "-oom")
        self._update("#anatomy-alert", alert if alert is not None else "")

        rec = reconcile(process.hello, snap, nvml_bytes) if snap is not None else None
        self.reconciled = rec
        bar = self.query_one(StackedBar)
        bar.set_segments([(r.component, r.bytes or 0) for r in rec.rows] if rec is not None else [])
        cells = component_cells(rec, self.plain) if rec is not None else {}
        self.query_one("#anatomy-components", LineTable).set_rows(list(cells.items()))
        self._update(
            "#anatomy-reconcile",
            reconcile_note(rec, snap.step if snap is not None else None)
            if rec is not None
            else Text("no snapshot yet", style="bright_black"),
        )
        gpu_line = (
            gpu_memory_line(rec, nvml_bytes, process.hello.device if process.hello is not None else None)
            if rec is not None
            else None
        )
        gpu_widget = self.query_one("#anatomy-gpu-memory", TextStatic)
        gpu_widget.display = gpu_line is not None
        self._update("#anatomy-gpu-memory", gpu_line if gpu_line is not None else "")
        self._update("#anatomy-timing", timing_text(snap))
        groups = op_group_cells(snap)
        opgroups = self.query_one("#anatomy-opgroups", LineTable)
        opgroups.display = bool(groups)
        self._update("#anatomy-opgroups-label", op_groups_label(snap))
        opgroups.set_rows(list(groups.items()))

        self._history(process)
        job = job_of(process, list(group))
        self.set_class(job is not None, "-ranks")
        rows: list[tuple[str, tuple[Text, ...]]] = []
        if job is not None:
            rows = [(str(r.pid), rank_cells(r, job, process.pid)) for r in job.ranks]
            rows.append(("total", job_total_cells(job)))
        self.query_one("#anatomy-ranks", LineTable).set_rows(rows)
        self._update("#anatomy-ranks-label", ranks_label(job))
        self._update("#anatomy-suggestions", suggestion_text(snap.suggestions if snap is not None else ()))

    def _history(self, process: TrainingProcess) -> None:
        memory = [float(v) for v in process.memory_history]
        steps = [float(v) for v in process.step_time_history]
        # The step's peak, as in the table's total line (tui.sources.anatomy_source.measured_total).
        mem_label = Text("Peak ", style="bold")
        mem_label.append(fmt.fmt_bytes(memory[-1] if memory else None), style="bright_black")
        step_label = Text("Step time ", style="bold")
        step_label.append(fmt.fmt_seconds(steps[-1] if steps else None), style="bright_black")
        self._update("#spark-memory-label", mem_label)
        self._update("#spark-step-label", step_label)
        # Sparkline redraws only when its data is re-assigned: assign only when it changed.
        for spark_id, data in (("#spark-memory", memory), ("#spark-step", steps)):
            spark = self.query_one(spark_id, Sparkline)
            if list(spark.data or []) != data:
                spark.data = data
