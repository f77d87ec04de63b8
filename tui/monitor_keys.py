"""The monitor's own keys and what they do: the app's bindings, each with an ``id`` (a keymap can rebind
it) and a ``tooltip``, the sentence the help screen (``tui.screens.help``) shows for it, and
``MonitorKeys``, the app's base class that answers them (the layout, the sort, the filter line, the pause
and interval, the OOM record, the selected process's actions through ``tui.selection``). Polling and
drawing are the app's (``tui.app``); the methods this class calls of it are declared below.

Their order is the key bar's (those with ``show``). The help puts bindings whose ids share the part
before the first dot on one row (``signal.kill``, ``signal.terminate``: "T  K  I") and orders the rows
by that part (``tui.screens.help.ORDER``). Widgets and screens declare their own keys beside the code
that answers them (``l`` on the anatomy pane, the cursor keys on the tables, each screen's on it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import ClassVar

from textual import on
from textual.app import App
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.reactive import var
from textual.timer import Timer
from textual.widgets import Input

from anatomy.vocabulary import PublisherState
from tui.intervals import MAX_INTERVAL, MIN_INTERVAL, next_interval
from tui.screens.process_requests import EnvironmentRequested, SignalRequested
from tui.selection import Selection
from tui.source_protocols import AnatomySourceLike
from tui.sources.anatomy_source import TrainingProcess
from tui.view.poll import PollView
from tui.widgets.anatomy_pane import AnatomyPane
from tui.widgets.gpu_history import GpuHistory
from tui.widgets.gpu_table import COMPACT, FULL, GpuTable
from tui.widgets.layout import anatomy_width, gpu_mode_for, is_wide
from tui.widgets.line_table import LineTable
from tui.widgets.process_table import ProcessTable
from tui.widgets.status_lines import PANE_ANATOMY, PANE_NVSMI

MOVE = "move the selection (scroll the anatomy pane)"
SIGNAL = "send SIGTERM / SIGKILL / SIGINT to the selected process (asks first)"
FILTER_BY = "only the selected process's user / GPU / PID; again: all"
QUIT = "quit"

MONITOR_BINDINGS: list[BindingType] = [
    Binding("q", "quit", "Quit", id="quit", tooltip=QUIT),
    Binding("ctrl+c", "quit", "Interrupt", show=False, priority=True, id="quit.ctrl-c", tooltip=QUIT),
    Binding("question_mark", "help", "Help", id="help", tooltip="show this help"),
    Binding(
        "tab",
        "switch_pane",
        "Pane",
        priority=True,
        id="switch-pane",
        tooltip="switch pane: processes / anatomy (one at a time below 160 cols)",
    ),
    Binding(
        "f",
        "gpu_layout",
        "Full/compact",
        id="gpu-layout",
        tooltip="GPU table: every field, two lines per GPU / compact, one line",
    ),
    Binding(
        "s",
        "cycle_sort",
        "Sort",
        id="sort",
        tooltip="sort by the next column (first: ◆ training jobs, then GPU memory)",
    ),
    Binding("S", "reverse_sort", "Rev", id="reverse-sort", tooltip="reverse the sort order"),
    Binding("slash", "filter", "Filter", id="filter", tooltip="filter processes by command, user or PID"),
    Binding("p", "pause", "Pause", id="pause", tooltip="pause / resume refreshing"),
    Binding(
        "plus", "slower", "+Intvl", show=False, id="slower", tooltip="refresh less often (longer interval)"
    ),
    Binding(
        "minus", "faster", "-Intvl", show=False, id="faster", tooltip="refresh more often (shorter interval)"
    ),
    Binding("x", "dismiss", "Dismiss", show=False, id="dismiss", tooltip="dismiss the shown OOM record"),
    Binding("j", "move(1)", "Down", show=False, id="move.down", tooltip=MOVE),
    Binding("k", "move(-1)", "Up", show=False, id="move.up", tooltip=MOVE),
    Binding(
        "escape", "escape", "Clear", show=False, id="escape", tooltip="clear the filter; close this help"
    ),
    # Acting on the selected process (tui/selection.py).
    Binding(
        "t",
        "tree",
        "Tree",
        id="tree",
        tooltip="process tree: GPU processes with their parents and children",
    ),
    Binding(
        "e",
        "environment",
        "Env",
        id="environment",
        tooltip="the selected process's environment (if /proc/PID/environ is readable)",
    ),
    Binding("T", "signal('terminate')", "Term", show=False, id="signal.terminate", tooltip=SIGNAL),
    Binding("K", "signal('kill')", "Kill", id="signal.kill", tooltip=SIGNAL),
    Binding("I", "signal('interrupt')", "Int", show=False, id="signal.interrupt", tooltip=SIGNAL),
    Binding(
        "enter",
        "metrics",
        "Metrics",
        show=False,
        id="metrics",
        tooltip="keep the filter; on a process: its metrics over time",
    ),
    Binding("u", "filter_by('user')", "User", show=False, id="filter-by.user", tooltip=FILTER_BY),
    Binding("g", "filter_by('gpu')", "GPU", show=False, id="filter-by.gpu", tooltip=FILTER_BY),
    Binding("P", "filter_by('pid')", "PID", show=False, id="filter-by.pid", tooltip=FILTER_BY),
    Binding(
        "h",
        "gpu_history",
        "History",
        show=False,
        id="gpu-history",
        tooltip="GPU history: utilization and memory sparklines per GPU",
    ),
]


class MonitorKeys(App[int]):
    """What the monitor's keys do; ``tui.app.AnatomyTopApp`` is the app."""

    BINDINGS: ClassVar[list[BindingType]] = MONITOR_BINDINGS

    # The screen's state the keys change: each watcher below shows a change, whoever made it.
    paused: var[bool] = var(False, init=False)  # p: no polls until p again
    pane: var[str] = var(PANE_NVSMI, init=False)  # tab: the pane in front (one at a time when narrow)
    # f's choice of GPU table layout; None: by width (full side by side, compact below)
    gpu_mode: var[str | None] = var(None, init=False, always_update=True)

    # The app's state these keys read (set in AnatomyTopApp.__init__).
    anatomy_source: AnatomySourceLike
    interval: float
    selection: Selection
    training: list[TrainingProcess]
    view: PollView
    anatomy_pid: int | None
    errors: list[str]
    _polling: bool
    _timer: Timer | None
    # The app's polling and drawing.
    _schedule: Callable[[float], None]
    refresh_now: Callable[[], None]
    refresh_filters: Callable[[], None]
    _render_all: Callable[[], None]
    _render_header: Callable[[], None]
    _render_status: Callable[[], None]
    _render_tabs: Callable[[], None]
    _render_proc_bar: Callable[[], None]
    _render_anatomy: Callable[[], None]

    # -- filter input --------------------------------------------------------------------------

    @on(Input.Changed, "#filter")
    def _on_filter_changed(self, event: Input.Changed) -> None:
        self.query_one(ProcessTable).set_filter(event.value.strip())
        self._render_proc_bar()
        self._render_anatomy()

    @on(Input.Submitted, "#filter")
    def _on_filter_submitted(self, event: Input.Submitted) -> None:
        filter_input = self.query_one("#filter", Input)
        filter_input.display = bool(event.value.strip())
        self.query_one(ProcessTable).focus()

    # -- actions -------------------------------------------------------------------------------

    def action_help(self) -> None:
        from tui.screens.help import HelpScreen, monitor_key_rows  # not needed for the first frame

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(monitor_key_rows(self)))

    def action_switch_pane(self) -> None:
        if self.screen is not self.screen_stack[0]:  # the help screen (or another modal) is up
            return
        self.pane = PANE_ANATOMY if self.pane == PANE_NVSMI else PANE_NVSMI

    def watch_pane(self, pane: str) -> None:
        body = self.query_one("#body")
        body.set_class(pane == PANE_NVSMI, f"-pane-{PANE_NVSMI}")
        body.set_class(pane == PANE_ANATOMY, f"-pane-{PANE_ANATOMY}")
        if pane == PANE_ANATOMY:
            self.query_one(AnatomyPane).focus()
        else:
            self.query_one(ProcessTable).focus()
        self._render_tabs()

    def _apply_layout(self, width: int | None = None) -> None:
        """The anatomy pane's width side by side, and the GPU table's layout (f's choice, else by width)."""
        width = self.size.width if width is None else width
        mode = self.gpu_mode or gpu_mode_for(width)
        with contextlib.suppress(NoMatches):
            self.query_one(AnatomyPane).styles.width = anatomy_width(width) if is_wide(width) else "1fr"
            self.query_one(GpuTable).set_mode(mode)

    def action_gpu_layout(self) -> None:
        """Full (every field, two lines per GPU) <-> compact (one line per GPU); the choice then holds
        at any width."""
        current = self.query_one(GpuTable).mode
        self.gpu_mode = COMPACT if current == FULL else FULL

    def watch_gpu_mode(self) -> None:
        self._apply_layout()

    def action_cycle_sort(self) -> None:
        self.query_one(ProcessTable).cycle_sort()
        self._render_proc_bar()

    def action_reverse_sort(self) -> None:
        self.query_one(ProcessTable).toggle_reverse()
        self._render_proc_bar()

    def action_filter(self) -> None:
        filter_input = self.query_one("#filter", Input)
        filter_input.display = True
        if self.pane != PANE_NVSMI:
            self.action_switch_pane()
        filter_input.focus()

    def action_escape(self) -> None:
        filter_input = self.query_one("#filter", Input)
        if filter_input.display or filter_input.value:
            filter_input.value = ""
            filter_input.display = False
            self.query_one(ProcessTable).set_filter("")
            self.query_one(ProcessTable).focus()
            self._render_proc_bar()

    def action_pause(self) -> None:
        self.paused = not self.paused

    def watch_paused(self, paused: bool) -> None:
        if paused:
            if self._timer is not None:
                self._timer.stop()
        else:
            self._schedule(0.0)
        self._render_header()

    def action_slower(self) -> None:
        self._set_interval(next_interval(self.interval, +1))

    def action_faster(self) -> None:
        self._set_interval(next_interval(self.interval, -1))

    def _set_interval(self, value: float) -> None:
        self.interval = min(MAX_INTERVAL, max(MIN_INTERVAL, value))
        if not self.paused and not self._polling:
            self._schedule(self.interval)
        self._render_header()

    def action_dismiss(self) -> None:
        pane = self.query_one(AnatomyPane)
        process = pane.process
        dismiss = getattr(self.anatomy_source, "dismiss", None)
        if process is None or process.state is not PublisherState.OOM or dismiss is None:
            self.notify("nothing to dismiss: select a process marked OOM", timeout=3)
            return
        try:
            dismiss(process.pid)
        except Exception as exc:
            self.errors = [f"dismiss: {type(exc).__name__}: {exc}"]
            self._render_status()
            return
        self.view = self.view.without(process.pid)
        self.training = list(self.view.training)
        self.anatomy_pid = None
        self._render_all()
        self.refresh_now()

    # -- acting on the selected process (tui/selection.py) -------------------------------------

    def action_signal(self, name: str) -> None:
        self.selection.signal(name)

    def action_tree(self) -> None:
        self.selection.show_tree()

    def action_environment(self) -> None:
        self.selection.show_environment()

    def action_metrics(self) -> None:
        self.selection.show_metrics()

    def action_filter_by(self, kind: str) -> None:
        self.selection.toggle_filter(kind)

    @on(SignalRequested)
    def _on_signal_requested(self, request: SignalRequested) -> None:
        self.selection.request_signal(request.pid, request.started_at, request.name)

    @on(EnvironmentRequested)
    def _on_environment_requested(self, request: EnvironmentRequested) -> None:
        self.selection.show_environment_of(request.pid, request.user, request.command)

    def action_gpu_history(self) -> None:
        panel = self.query_one(GpuHistory)
        panel.display = not panel.display
        self.refresh_filters()

    def action_move(self, delta: int) -> None:
        focused = self.focused
        if isinstance(focused, LineTable):
            if delta > 0:
                focused.action_cursor_down()
            else:
                focused.action_cursor_up()
        elif isinstance(focused, AnatomyPane):
            if delta > 0:
                focused.scroll_down(animate=False)
            else:
                focused.scroll_up(animate=False)


__all__ = ["MONITOR_BINDINGS", "MonitorKeys"]
