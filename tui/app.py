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
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.driver import Driver
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Input

from tui.intervals import (
    DEFAULT_INTERVAL,
    INTERVAL_STEPS,
    MAX_INTERVAL,
    MIN_INTERVAL,
    clamp_interval,
    next_interval,
)
from tui.sources.anatomy_source import TrainingProcess, TrainingReading
from tui.sources.filters import ProcessFilter
from tui.sources.history import MachineHistory
from tui.sources.model import GpuProcess, MachineSnapshot, SourceError
from tui.terminal import Display
from tui.view.anatomy_text import stale_text
from tui.view.poll import PollView, poll_view
from tui.widgets import display_filter
from tui.widgets.anatomy_pane import AnatomyPane
from tui.widgets.gpu_history import GpuHistory
from tui.widgets.gpu_table import COMPACT, FULL, GpuTable
from tui.widgets.header import MachineHeader, NvmlBanner
from tui.widgets.key_bar import KeyBar
from tui.widgets.layout import WIDE_FROM, anatomy_width, gpu_mode_for, is_wide
from tui.widgets.line_table import LineTable
from tui.widgets.process_table import ProcessTable
from tui.widgets.text_static import TextStatic

EXIT_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)

__all__ = [
    "INTERVAL_STEPS",
    "MAX_INTERVAL",
    "MIN_INTERVAL",
    "AnatomyTopApp",
    "next_interval",
    "run_app",
]

NARROW, WIDE = "-narrow", "-wide"
STALE_AFTER_S = 10.0  # a live publisher silent this long (or 3 refreshes) is flagged in the anatomy pane
PANE_NVSMI, PANE_ANATOMY = "nvsmi", "anatomy"


class MachineSourceLike(Protocol):
    def snapshot(self) -> MachineSnapshot: ...
    def close(self) -> None: ...


class AnatomySourceLike(Protocol):
    def read(self) -> TrainingReading: ...
    def close(self) -> None: ...


class Polled(Message):
    """One poll's results, posted from the worker thread: what each pane shows (``view``, with the last
    machine snapshot where this poll read none), and what the poll could not do (``errors``, cleaned)."""

    def __init__(
        self, view: PollView, machine: MachineSnapshot | None = None, errors: list[str] | None = None
    ) -> None:
        super().__init__()
        self.view = view
        self.machine = machine  # this poll's machine snapshot; None where NVML's side failed
        self.errors = errors or []

    def can_replace(self, message: Message) -> bool:
        # A newer sample makes a queued older one worthless.
        return isinstance(message, Polled)


class HostFigures:
    """Host figures (user, command, CPU %, RSS, running time) for publishing processes NVML does not
    list: CPU training, or no NVIDIA driver. Called in the poll worker, never on the UI thread."""

    def __init__(self) -> None:
        from tui.sources.processes import ProcessEnricher

        self._enricher = ProcessEnricher()

    def __call__(self, pids: Sequence[int]) -> dict[int, GpuProcess]:
        bare = [GpuProcess(gpu_index=-1, pid=pid, type="-") for pid in pids]
        return {p.pid: p for p in self._enricher.enrich(bare)}


# How often the monitor checks that its terminal still has an owner (see _exit_if_orphaned).
ORPHAN_CHECK_S = 2.0


class AnatomyTopApp(App[int]):
    TITLE = "anatomy-top"
    CSS_PATH = "app.tcss"
    HORIZONTAL_BREAKPOINTS = [(0, NARROW), (WIDE_FROM, WIDE)]  # noqa: RUF012 (Textual declares the type)
    ENABLE_COMMAND_PALETTE = False

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "Quit"),
        Binding("ctrl+c", "quit", "Interrupt", show=False, priority=True),
        Binding("question_mark", "help", "Help"),
        Binding("tab", "switch_pane", "Pane", priority=True),
        Binding("f", "gpu_layout", "Full/compact"),
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Rev"),
        Binding("slash", "filter", "Filter"),
        Binding("p", "pause", "Pause"),
        Binding("plus", "slower", "+Intvl", show=False),
        Binding("minus", "faster", "-Intvl", show=False),
        Binding("x", "dismiss", "Dismiss", show=False),
        Binding("j", "move(1)", "Down", show=False),
        Binding("k", "move(-1)", "Up", show=False),
        Binding("escape", "escape", "Clear", show=False),
        # Acting on the selected process (tui/process_actions.py).
        Binding("t", "tree", "Tree"),
        Binding("e", "environment", "Env"),
        Binding("K", "signal('kill')", "Kill"),
        Binding("T", "signal('terminate')", "Term", show=False),
        Binding("I", "signal('interrupt')", "Int", show=False),
        Binding("enter", "metrics", "Metrics", show=False),
        Binding("u", "filter_by('user')", "User", show=False),
        Binding("g", "filter_by('gpu')", "GPU", show=False),
        Binding("P", "filter_by('pid')", "PID", show=False),
        Binding("h", "gpu_history", "History", show=False),
    ]

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
        self.paused = False
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
        # A training job known to be starting (the demo's): the anatomy pane waits for it by name.
        self.starting_pid = starting_pid
        self.gpu_mode: str | None = None  # None: by width (full side by side, compact below); else f's choice
        self.training: list[TrainingProcess] = []
        self.host_figures: dict[int, GpuProcess] = {}
        # What the panes show, computed off the UI thread (the start-up frame's machine until a poll).
        self.view = poll_view(first_machine, (), plain=self.caps.plain)
        self.errors: list[str] = []
        self.polls = 0  # completed polls, for tests and the status line
        self.pane = PANE_NVSMI
        self.anatomy_pid: int | None = None  # the publishing process the anatomy pane follows
        self._handle_signals = handle_signals
        self._monotonic = monotonic  # the clock of TrainingProcess.updated_at
        self._close_sources = close_sources
        self._host_lookup = host_lookup if host_lookup is not None else HostFigures()
        self._polling = False
        self._timer: Timer | None = None
        self._signals_installed = False
        self._parent_pid = os.getppid()
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
            self._install_signals()
            self._parent_pid = os.getppid()
            self.set_interval(ORPHAN_CHECK_S, self._exit_if_orphaned, name="orphan-check")
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
        if self._signals_installed:
            for sig in EXIT_SIGNALS:
                with contextlib.suppress(Exception):
                    asyncio.get_running_loop().remove_signal_handler(sig)
        if self._close_sources:
            for source in (self.machine_source, self.anatomy_source):
                with contextlib.suppress(Exception):
                    source.close()

    def get_driver_class(self) -> type[Driver]:
        from tui.hangup_driver import hangup_safe

        return hangup_safe(super().get_driver_class())

    def _install_signals(self) -> None:
        # SIGTERM (kill, systemd, tmux kill-pane), SIGHUP (the terminal went away) and SIGINT from another
        # process end the monitor the way `q` does: Textual gives the terminal back (alternate screen off,
        # mouse tracking off, cursor shown), then the status is 128 + the signal's number, as a shell
        # reports a process killed by it.
        try:
            loop = asyncio.get_running_loop()
            for sig in EXIT_SIGNALS:
                loop.add_signal_handler(sig, self._exit_on_signal, sig)
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            return
        self._signals_installed = True

    def _exit_on_signal(self, sig: int) -> None:
        self.exit(return_code=128 + int(sig))

    def _exit_if_orphaned(self) -> None:
        # SIGHUP can be lost (a pty torn down while Textual starts up, under load): such monitors were
        # seen lingering with a deleted tty. The terminal's owner going away re-parents us, so a changed
        # parent PID means nobody is looking at this screen any more.
        if os.getppid() != self._parent_pid:
            self.exit()

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
                from tui import process_actions

                process_actions.check_filter(self)
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
        text = Text()
        for i, error in enumerate(self.errors):
            if i:
                text.append("\n")
            text.append("error ", style="bold red")
            text.append(Text(error))
        status.show_text(text)

    def _render_tabs(self) -> None:
        text = Text()
        for pane, label in ((PANE_NVSMI, "nvidia-smi"), (PANE_ANATOMY, "anatomy")):
            style = "bold reverse cyan" if self.pane == pane else "bright_black"
            text.append(f" {label} ", style=style)
            text.append(" ")
        text.append(" tab switches", style="bright_black")
        self.query_one("#pane-tabs", TextStatic).show_text(text)

    def _render_proc_bar(self) -> None:
        table = self.query_one(ProcessTable)
        text = Text("Processes ", style="bold")
        shown, total = table.row_count, table.total_count
        text.append(f"{shown}" if shown == total else f"{shown} of {total}")
        publishing = len(self.training)
        if publishing:
            text.append(f" · {publishing} publishing ◆", style="green")
        text.append(f" · sort {table.sort_label}", style="bright_black")
        if self.process_filter.active:
            text.append(" · only ", style="bright_black")
            text.append(self.process_filter.describe(), style="yellow")
        if table.filter_text:
            text.append(" · filter ", style="bright_black")
            text.append(Text(repr(table.filter_text), style="yellow"))
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
        if process is None or process.state != "live" or process.updated_at is None:
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
        from tui.widgets.help_screen import HelpScreen  # not needed for the first frame

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_switch_pane(self) -> None:
        if self.screen is not self.screen_stack[0]:  # the help screen (or another modal) is up
            return
        self.pane = PANE_ANATOMY if self.pane == PANE_NVSMI else PANE_NVSMI
        body = self.query_one("#body")
        body.set_class(self.pane == PANE_NVSMI, f"-pane-{PANE_NVSMI}")
        body.set_class(self.pane == PANE_ANATOMY, f"-pane-{PANE_ANATOMY}")
        if self.pane == PANE_ANATOMY:
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
        if self.paused:
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
        if process is None or process.state != "oom" or dismiss is None:
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

    # -- acting on processes (the logic is in tui/process_actions.py, imported when first used) ----

    def action_signal(self, name: str) -> None:
        from tui import process_actions

        process_actions.signal_selected(self, name)

    def action_tree(self) -> None:
        from tui import process_actions

        process_actions.show_tree(self)

    def action_environment(self) -> None:
        from tui import process_actions

        process_actions.show_environment(self)

    def action_metrics(self) -> None:
        from tui import process_actions

        process_actions.show_metrics(self)

    def action_filter_by(self, kind: str) -> None:
        from tui import process_actions

        process_actions.toggle_filter(self, kind)

    def action_gpu_history(self) -> None:
        from tui import process_actions

        process_actions.toggle_history(self)

    def refresh_filters(self) -> None:
        """Show the current filters and panels at once, without waiting for the next poll."""
        with contextlib.suppress(NoMatches):
            self._render_all()

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
