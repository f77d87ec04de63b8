"""The anatomy-top Textual app: nvidia-smi's view on one side, the selected training process's anatomy
on the other.

Data comes from two injected sources (tests pass fakes): ``machine_source.snapshot() -> MachineSnapshot``
(NVML + host) and ``anatomy_source.read() -> TrainingReading`` (the hooks' sockets). Both are polled in
one background thread, which also computes what each pane shows (``tui.view.poll_view``); the next poll
is scheduled when the last one was shown, so polls never overlap and a slow NVML never blocks the UI.
Nothing here imports torch.

A monitor must stay cheap beside a training run: a refresh repaints only the table cells whose text
changed, and everything static is painted once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePath
from typing import Any, ClassVar

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.driver import Driver
from textual.timer import Timer
from textual.widgets import Input

from anatomy.vocabulary import PublisherState
from tui.exit_signals import ExitSignals
from tui.host_figures import HostFigures
from tui.intervals import DEFAULT_INTERVAL, clamp_interval
from tui.monitor_keys import MonitorKeys
from tui.notices import tell, unknown_gpus_notice
from tui.polled import Polled
from tui.selection import Selection
from tui.source_protocols import AnatomySourceLike, MachineSourceLike
from tui.sources.anatomy_source import TrainingProcess
from tui.sources.filters import ProcessFilter
from tui.sources.history import MachineHistory
from tui.sources.model import GpuProcess, MachineSnapshot, SourceError
from tui.terminal import Display
from tui.view.anatomy_text import stale_text
from tui.view.poll import PollView, poll_view
from tui.widgets import display_filter
from tui.widgets.anatomy_pane import AnatomyPane
from tui.widgets.gpu_history import GpuHistory
from tui.widgets.gpu_table import GpuTable
from tui.widgets.header import MachineHeader, NvmlBanner
from tui.widgets.key_bar import KeyBar
from tui.widgets.layout import WIDE_FROM
from tui.widgets.line_table import LineTable
from tui.widgets.process_table import ProcessTable
from tui.widgets.status_lines import PANE_NVSMI, pane_tabs_text, proc_bar_text, status_text
from tui.widgets.stylesheet import WIDGETS_TCSS
from tui.widgets.text_static import TextStatic

__all__ = ["AnatomyTopApp", "run_app"]

NARROW, WIDE = "-narrow", "-wide"
STALE_AFTER_S = 10.0  # a live publisher silent this long (or 3 refreshes) is flagged in the anatomy pane


class AnatomyTopApp(MonitorKeys):
    TITLE = "anatomy-top"
    # The widgets' stylesheet first: app.tcss, read after it, wins a tie as it did over their DEFAULT_CSS.
    CSS_PATH: ClassVar[list[str | PurePath]] = [WIDGETS_TCSS, "app.tcss"]
    HORIZONTAL_BREAKPOINTS = [(0, NARROW), (WIDE_FROM, WIDE)]  # noqa: RUF012 (Textual declares the type)
    ENABLE_COMMAND_PALETTE = False

    def __init__(
        self,
        machine_source: MachineSourceLike,
        anatomy_source: AnatomySourceLike,
        interval: float = DEFAULT_INTERVAL,
        *,
        handle_signals: bool = True,
        close_sources: bool = True,
        host_lookup: Callable[[Sequence[int]], Mapping[int, GpuProcess]] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        caps: Display | None = None,
        first_machine: MachineSnapshot | None = None,
        starting_pid: int | None = None,
        process_filter: ProcessFilter | None = None,
    ) -> None:
        super().__init__()
        self.machine_source = machine_source
        self.anatomy_source = anatomy_source
        self.interval = clamp_interval(interval)
        # What the terminal can show (colour, Unicode); the display filter enforces it on every line.
        self.caps = caps if caps is not None else Display()
        self._restore_scrollbars = display_filter.install(self._filters, self.caps)
        self.set_class(self.caps.plain, "-plain")
        self.set_class(self.caps.ascii, "-ascii")
        # A machine snapshot read before Textual started (the start-up frame's): shown at once.
        if first_machine is not None:
            from tui.sources import on_screen

            first_machine = on_screen.machine(first_machine)
        self.machine: MachineSnapshot | None = first_machine
        # What --only/--user/--pid and u/g/P show; the history every view's charts read.
        self.process_filter = process_filter if process_filter is not None else ProcessFilter()
        self.history = MachineHistory()
        if first_machine is not None:
            self.history.record(first_machine)
        self.action_messages: list[str] = []  # what the process actions told, newest last
        self.selection = Selection(self)  # the process under the table's cursor, and its actions
        # A training job known to be starting (the demo's): the anatomy pane waits for it by name.
        self.starting_pid = starting_pid
        self.training: list[TrainingProcess] = []
        self.host_figures: dict[int, GpuProcess] = {}
        # What the panes show, computed off the UI thread (the start-up frame's machine until a poll).
        self.view = poll_view(first_machine, (), plain=self.caps.plain)
        self.errors: list[str] = []
        self.polls = 0  # completed polls, for tests and the status line
        self.anatomy_pid: int | None = None  # the publishing process the anatomy pane follows
        self._handle_signals = handle_signals
        self._monotonic = monotonic  # the clock of TrainingProcess.updated_at
        self._close_sources = close_sources
        self._host_lookup = host_lookup if host_lookup is not None else HostFigures()
        self._polling = False
        self._timer: Timer | None = None
        self._exit_signals = ExitSignals(self)
        self._anatomy_shown: tuple[object, ...] | None = None  # what the anatomy pane last drew

    # -- layout ----------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield MachineHeader(id="header")
        yield NvmlBanner(id="banner")
        yield TextStatic(id="status")
        yield TextStatic(id="pane-tabs")
        with Horizontal(id="body", classes=f"-pane-{PANE_NVSMI}"):
            with Vertical(id="nvsmi-pane"):
                yield GpuTable(id="gpus")
                yield GpuHistory(id="gpu-history")
                yield TextStatic(id="proc-bar")
                yield Input(placeholder="filter: command, user or PID", id="filter")
                yield ProcessTable(id="processes")
            yield AnatomyPane(id="anatomy")
        yield KeyBar([b for b in self.BINDINGS if isinstance(b, Binding)], id="keys")

    def on_mount(self) -> None:
        self.query_one("#filter", Input).display = False
        self.query_one(GpuHistory).display = False
        self.query_one(ProcessTable).focus()
        self._apply_layout()
        if self.machine is not None:
            self._render_all()
        self._render_header()
        self._render_tabs()
        self._render_proc_bar()
        self._render_status()
        if self._handle_signals:
            self._exit_signals.install()
            from tui import startup_signals

            early = startup_signals.pending()  # one that came while Textual started, before our handlers
            if early is not None:
                self.exit(return_code=128 + early)
        self._schedule(0.0)

    def on_resize(self, event: events.Resize) -> None:
        self._apply_layout(event.size.width)  # self.size is not updated yet

    def on_unmount(self) -> None:
        self._restore_scrollbars()
        if self._timer is not None:
            self._timer.stop()
        self._exit_signals.remove()
        if self._close_sources:
            for source in (self.machine_source, self.anatomy_source):
                with contextlib.suppress(Exception):
                    source.close()

    def get_driver_class(self) -> type[Driver]:
        from tui.hangup_driver import hangup_safe

        return hangup_safe(super().get_driver_class())

    # -- polling -------------------------------------------------------------------------------

    def _schedule(self, delay: float) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        if delay <= 0:
            self.call_later(self._start_poll)
        else:
            self._timer = self.set_timer(delay, self._start_poll, name="poll")

    def _start_poll(self) -> None:
        if self.paused or self._polling:
            return
        self._polling = True
        # A plain daemon thread, not a Textual worker: a worker sends three state-change messages
        # through the app's queue on every refresh; a daemon never holds up the exit if NVML hangs.
        threading.Thread(target=self._poll_in_thread, name="anatomy-top-poll", daemon=True).start()

    def _poll_in_thread(self) -> None:
        polled = self.collect()
        with contextlib.suppress(RuntimeError):  # the event loop closed while this sample was taken
            self.post_message(polled)

    def collect(self) -> Polled:
        """One sample of both sources (blocking: call it off the UI thread). Never raises."""
        errors: list[str] = []
        machine: MachineSnapshot | None = None
        training: list[TrainingProcess] = []
        source_errors: tuple[SourceError, ...] = ()
        figures: dict[int, GpuProcess] = {}
        try:
            machine = self.machine_source.snapshot()
        except Exception as exc:
            errors.append(f"GPU data: {type(exc).__name__}: {exc}")
        try:
            reading = self.anatomy_source.read()
            training, source_errors = list(reading.processes), reading.errors
        except Exception as exc:
            errors.append(f"training data: {type(exc).__name__}: {exc}")
        try:
            on_gpu = {p.pid for p in machine.processes} if machine is not None else set()
            missing = [t.pid for t in training if t.pid not in on_gpu]
            if missing:
                figures = dict(self._host_lookup(missing))
        except Exception as exc:
            errors.append(f"host data: {type(exc).__name__}: {exc}")
        # Every string another process chose is cleaned here, once, before any widget sees it.
        from tui.sources import on_screen

        try:
            machine = on_screen.machine(machine) if machine is not None else None
            training = on_screen.training(training)
            figures = {pid: on_screen.gpu_process(p) for pid, p in figures.items()}
        except Exception as exc:
            errors.append(f"cleaning: {type(exc).__name__}: {exc}")
            machine, training, figures = None, [], {}
        errors += [str(e) for e in source_errors]
        previous = self.view
        shown = machine if machine is not None else previous.machine  # the last one stays on screen
        try:
            view = poll_view(
                shown, training, figures, source_errors, plain=self.caps.plain, previous=previous
            )
        except Exception as exc:
            errors.append(f"display: {type(exc).__name__}: {exc}")
            view = PollView(machine=shown)
        return Polled(view, machine, [on_screen.clean(e) for e in errors])

    def on_polled(self, message: Polled) -> None:
        self._polling = False
        self.polls += 1
        if message.machine is not None:
            self.machine = message.machine
            self.history.record(message.machine)
            if self.polls == 1 and self.process_filter.gpus is not None:
                notice = unknown_gpus_notice(self.process_filter, self.machine)
                if notice is not None:
                    tell(self, notice, "warning", 10)
        view = self.view = message.view
        self.training = list(view.training)
        self.host_figures = dict(view.host_figures)
        self.errors = message.errors
        try:
            self._render_all()
        except NoMatches:
            pass  # the screen is being torn down
        except Exception as exc:  # a bad sample must never take the monitor down
            self.errors = [*self.errors, f"display: {type(exc).__name__}: {exc}"]
            with contextlib.suppress(NoMatches):
                self._render_status()
        if not self.paused:
            self._schedule(self.interval)

    async def wait_for_poll(self, count: int = 1, timeout: float = 10.0) -> None:
        """For tests and scripts: wait until ``count`` polls in total have been shown."""
        deadline = time.monotonic() + timeout
        while self.polls < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.polls} polls after {timeout} s")
            await asyncio.sleep(0.01)

    def refresh_now(self) -> None:
        """Poll at once (if no poll is in flight)."""
        self._schedule(0.0)

    # -- rendering -----------------------------------------------------------------------------

    def _render_all(self) -> None:
        with self.batch_update():
            self._render_header()
            self.query_one(NvmlBanner).show(self.machine)
            gpus = [g for g in self.view.gpus if self.process_filter.keeps_gpu(g.index)]
            self.query_one(GpuTable).show(gpus)
            history = self.query_one(GpuHistory)
            if history.display:
                history.show([g.gpu for g in gpus], self.history)
            rows = self.process_filter.rows(list(self.view.rows))
            table = self.query_one(ProcessTable)
            table.show(rows, self.view.cells)
            if not table.user_moved:
                # Until the user moves it, the cursor is on a process that publishes its anatomy (the
                # first one to appear, even seconds after start), so both panes say something.
                selected = table.selected_row
                first = next(
                    (i for i, k in enumerate(table.row_keys) if table.rows_by_key[k].publishes), None
                )
                if first is not None and (selected is None or not selected.publishes):
                    table.move_cursor(first)
            self._render_proc_bar()
            self._render_anatomy()
            self._render_status()

    def _render_header(self) -> None:
        self.query_one(MachineHeader).show(self.view.header, self.interval, self.paused)

    def _render_status(self) -> None:
        status = self.query_one("#status", TextStatic)
        status.display = bool(self.errors)
        status.show_text(status_text(self.errors))

    def _render_tabs(self) -> None:
        self.query_one("#pane-tabs", TextStatic).show_text(pane_tabs_text(self.pane))

    def _render_proc_bar(self) -> None:
        table = self.query_one(ProcessTable)
        publishing = len(self.training)
        only = self.process_filter.describe() if self.process_filter.active else None
        text = proc_bar_text(
            table.row_count, table.total_count, publishing, table.sort_label, only, table.filter_text
        )
        self.query_one("#proc-bar", TextStatic).show_text(text)

    def _selected_training(self) -> TrainingProcess | None:
        by_pid = {t.pid: t for t in self.training}
        row = self.query_one(ProcessTable).selected_row
        if row is not None and row.pid in by_pid:
            self.anatomy_pid = row.pid
        if self.anatomy_pid in by_pid:
            return by_pid[self.anatomy_pid]
        # Nothing publishing selected: the only (or first) publishing process.
        first = next(iter(sorted(by_pid.values(), key=lambda t: t.pid)), None)
        self.anatomy_pid = first.pid if first is not None else None
        return first

    def _render_anatomy(self, only_if_changed: bool = False) -> None:
        process = self._selected_training()
        row = self.query_one(ProcessTable).selected_row
        hint = None
        if process is not None and row is not None and row.pid != process.pid:
            # Which job the pane shows, not a verdict on the selected row: it may still be starting.
            hint = f"showing ◆ PID {process.pid} (select a ◆ row to follow another job)"
        pane = self.query_one(AnatomyPane)
        pane.waiting_for = self._starting_label()
        if only_if_changed and process is pane.process and hint == pane.hint:
            return
        view = self.view.anatomy.get(process.pid) if process is not None else None
        stale_s = self._stale_seconds(process)
        # The poll worker hands out the same view while a publisher sends nothing new: then the pane
        # has nothing new to draw.
        shown = (view, hint, None if stale_s is None else int(stale_s), pane.waiting_for)
        if shown == self._anatomy_shown and pane.process is not None and pane.process == process:
            return
        self._anatomy_shown = shown
        pane.show(view, hint=hint, stale=stale_text(stale_s) if stale_s is not None else None)

    def _starting_label(self) -> str | None:
        """While a training job known to be starting has not published: what the pane waits for."""
        pid = self.starting_pid
        if pid is None:
            return None
        if any(t.pid == pid and t.snapshot is not None for t in self.training):
            self.starting_pid = None  # it published: from now on it is an ordinary job
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass  # alive, someone else's
        return "waiting for the training job to publish (starting)"

    def _stale_seconds(self, process: TrainingProcess | None) -> float | None:
        """How long a live publisher has sent nothing new, once that is clearly more than its pace."""
        if process is None or process.state is not PublisherState.LIVE or process.updated_at is None:
            return None
        quiet = self._monotonic() - process.updated_at
        return quiet if quiet >= max(STALE_AFTER_S, 3 * self.interval) else None

    @on(LineTable.CursorMoved, "#processes")
    def _on_process_highlighted(self, event: LineTable.CursorMoved) -> None:
        try:
            self._render_anatomy(only_if_changed=True)
        except NoMatches:
            return  # the screen is being torn down: nothing to show any more
        except Exception as exc:
            self.errors = [f"display: {type(exc).__name__}: {exc}"]
            with contextlib.suppress(NoMatches):
                self._render_status()

    def refresh_filters(self) -> None:
        """Show the current filters and panels at once, without waiting for the next poll."""
        with contextlib.suppress(NoMatches):
            self._render_all()


def run_app(
    args: Any,
    *,
    nvml: Any = None,
    first_machine: MachineSnapshot | None = None,
    caps: Display | None = None,
    starting_pid: int | None = None,
    painted: bool = False,
) -> int:
    """Run the monitor in this terminal with the real sources; returns the exit status.

    ``nvml``: the NvmlSource the command line already read ``first_machine`` from (kept, with its
    caches); ``painted``: the start-up frame is on the alternate screen, to be given back if the monitor
    cannot start (once running, Textual leaves the alternate screen itself)."""
    interval = float(getattr(args, "interval", DEFAULT_INTERVAL) or DEFAULT_INTERVAL)
    if caps is None:
        from tui.terminal import detect

        caps = detect(ascii_only=bool(getattr(args, "ascii", False)))

    def give_back_terminal() -> None:
        if painted:
            from tui.first_frame import leave

            leave()

    try:
        from tui.sources.anatomy_source import AnatomySource
        from tui.sources.machine import MachineSource

        machine_source = MachineSource(nvml=nvml)
        from tui.sources.run_history import RunHistories

        # Charts that reach back to each run's start: the live processes' flight records are followed.
        anatomy_source = AnatomySource(histories=RunHistories())
    except Exception as exc:
        give_back_terminal()
        print(f"anatomy-top: cannot start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    app = AnatomyTopApp(
        machine_source=machine_source,
        anatomy_source=anatomy_source,
        interval=interval,
        caps=caps,
        first_machine=first_machine,
        starting_pid=starting_pid,
        process_filter=getattr(args, "process_filter", None),
    )
    from tui import startup_signals

    startup_signals.hand_over(app)  # a signal from now on exits the app instead of raising into Textual
    try:
        app.run()
    except Exception as exc:  # no traceback for users
        if app._driver is None:
            give_back_terminal()
        early = startup_signals.pending()
        if early is not None:  # the terminal hung up as Textual started: what failed is drawing on it
            return 128 + early
        print(f"anatomy-top: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        for source in (machine_source, anatomy_source):
            with contextlib.suppress(Exception):
                source.close()
    return app.return_code or 0
