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

from anatomy.vocabulary import PublisherState
from tui.sources.reconcile import Reconciled
from tui.sources.training import TrainingProcess
from tui.view.anatomy import EMPTY_HINT, AnatomyView, waiting_text
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

def _table(columns: Sequence[tuple[str, str]], right: Sequence[str] = (), **kwargs: Any) -> LineTable:
    return LineTable([(key, label, "right" if key in right else "left") for key, label in columns], **kwargs)


class AnatomyPane(VerticalScroll):
    """``show(view)`` draws one process's ``AnatomyView`` (tui.view.anatomy, computed off the UI thread);
    None shows how to start publishing."""

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
        self.view: AnatomyView | None = None
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
        self.show(None)

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

    @property
    def process(self) -> TrainingProcess | None:
        return self.view.process if self.view is not None else None

    @property
    def reconciled(self) -> Reconciled | None:
        return self.view.reconciled if self.view is not None else None

    def show(self, view: AnatomyView | None, hint: str | None = None, stale: Text | None = None) -> None:
        """Draw ``view`` (None: how to start publishing, or what the pane waits for); ``hint``: which job
        the pane shows; ``stale``: the title's last line when a live process went quiet."""
        self.view = view
        self.hint = hint
        starting = view is not None and view.starting
        self.set_class(view is None or starting, "-empty")
        if view is None or starting:
            self._update("#anatomy-empty", waiting_text(self.waiting_for, view))
            return
        process = view.process
        hint_widget = self.query_one("#anatomy-hint", TextStatic)
        hint_widget.display = hint is not None
        self._update("#anatomy-hint", Text(hint or "", style="italic bright_black"))
        title = view.title
        if stale is not None:
            title = title.copy()
            title.append_text(stale)
        self._update("#anatomy-title", title)
        alert_widget = self.query_one("#anatomy-alert", TextStatic)
        alert_widget.display = view.alert is not None
        alert_widget.set_class(process.state is PublisherState.OOM, "-oom")
        self._update("#anatomy-alert", view.alert if view.alert is not None else "")

        self.query_one(StackedBar).set_segments(view.segments)
        self.query_one("#anatomy-components", LineTable).set_rows(list(view.components))
        self._update("#anatomy-reconcile", view.reconcile_note)
        gpu_widget = self.query_one("#anatomy-gpu-memory", TextStatic)
        gpu_widget.display = view.gpu_memory is not None
        self._update("#anatomy-gpu-memory", view.gpu_memory if view.gpu_memory is not None else "")
        self._update("#anatomy-timing", view.timing)
        opgroups = self.query_one("#anatomy-opgroups", LineTable)
        opgroups.display = bool(view.op_groups)
        self._update("#anatomy-opgroups-label", view.op_groups_label)
        opgroups.set_rows(list(view.op_groups))

        self._history(view)
        self.set_class(view.job is not None, "-ranks")
        self.query_one("#anatomy-ranks", LineTable).set_rows(list(view.ranks))
        self._update("#anatomy-ranks-label", view.ranks_label)
        self._update("#anatomy-suggestions", view.suggestions)

    def _history(self, view: AnatomyView) -> None:
        self._update("#spark-memory-label", view.memory_label)
        self._update("#spark-step-label", view.step_label)
        # Sparkline redraws only when its data is re-assigned: assign only when it changed.
        for spark_id, data in (("#spark-memory", view.memory_history), ("#spark-step", view.step_history)):
            spark = self.query_one(spark_id, Sparkline)
            if list(spark.data or []) != list(data):
                spark.data = list(data)
