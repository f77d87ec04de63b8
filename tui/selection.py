"""The selected process and what the monitor's process keys do to it: signals with a confirmation, the
environment, the tree, the metrics screen and the filters on its user, GPU or PID.

Owned by the app (``app.selection``); the process is the one under the process table's cursor, read
when a key asks for it. The screens it opens and the app's state it reads (``machine``, ``host_figures``,
``interval``, ``history``, ``process_filter``) are the app's; screens that select processes of their own
(the tree) post ``tui.screens.process_requests`` messages, which the app hands to ``request_signal`` and
``show_environment_of``. Every outcome is told (``tui.notices.tell``); nothing here raises into the app.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from tui.notices import tell
from tui.sources.history import MachineHistory
from tui.sources.model import GpuProcess, MachineSnapshot

if TYPE_CHECKING:
    from tui.app import AnatomyTopApp
    from tui.sources.signals import Target

# How long after a signal the monitor checks whether the process is gone.
FOLLOW_UP_S = 1.0


class RowLike(Protocol):
    """What the selection needs of a process table row (``tui.view.process_rows.ProcessRow``)."""

    @property
    def pid(self) -> int: ...
    @property
    def gpu_index(self) -> int | None: ...
    @property
    def type(self) -> str: ...
    @property
    def user(self) -> str | None: ...
    @property
    def command(self) -> str | None: ...


def process_of_row(
    row: RowLike, machine: MachineSnapshot | None, host_figures: Mapping[int, GpuProcess]
) -> GpuProcess:
    """The GPU process a table row shows or, for a row without a GPU, the host's figures."""
    if row.gpu_index is not None and machine is not None:
        for proc in machine.processes:
            if proc.pid == row.pid and proc.gpu_index == row.gpu_index:
                return proc
    if row.pid in host_figures:
        return host_figures[row.pid]
    gpu_index = -1 if row.gpu_index is None else row.gpu_index
    return GpuProcess(gpu_index=gpu_index, pid=row.pid, type=row.type, user=row.user, command=row.command)


class Selection:
    def __init__(self, app: AnatomyTopApp) -> None:
        self.app = app

    @property
    def process(self) -> GpuProcess | None:
        """The process under the table's cursor, None where the table is empty."""
        from tui.widgets.process_table import ProcessTable

        row = self.app.query_one(ProcessTable).selected_row
        if row is None:
            return None
        return process_of_row(row, self.app.machine, self.app.host_figures)

    # -- signals ---------------------------------------------------------------------------------

    def signal(self, name: str) -> None:
        proc = self.process
        if proc is None:
            tell(self.app, "no process selected", "warning", 3)
            return
        self.request_signal(proc.pid, proc.started_at, name)

    def request_signal(self, pid: int, started_at: float | None, name: str) -> None:
        """Identify ``pid`` now (it must still be the process the table showed), check the policy, ask,
        send."""
        from tui.screens.signal_dialog import SignalDialog
        from tui.sources import signals

        app = self.app
        try:
            target = signals.identify(pid, expected_start=started_at)
        except signals.Gone as exc:
            tell(app, f"not sent: {exc}", "warning")
            return
        reason = signals.refusal(target)
        if reason is not None:
            tell(app, f"not permitted: {reason}", "error")
            return

        def answered(choice: str | None) -> None:
            if choice is None:
                tell(app, f"cancelled: nothing sent to PID {target.pid}", "information", 3)
                return
            sig = signals.SIGNALS[choice]
            outcome = signals.send(target, sig)
            tell(app, outcome.message, "information" if outcome.sent else "error")
            if outcome.sent:
                app.set_timer(FOLLOW_UP_S, lambda: self._follow_up(target, sig))
                app.refresh_now()

        app.push_screen(SignalDialog(target, name), answered)

    def _follow_up(self, target: Target, sig: int) -> None:
        from tui.sources import signals

        name = signals.signal_name(sig)
        if not signals.still_running(target):
            tell(self.app, f"PID {target.pid} ({target.name}) has exited")
        elif name == "SIGKILL":
            message = (
                f"PID {target.pid} is still there {FOLLOW_UP_S:g} s after SIGKILL: stuck in the kernel "
                "(uninterruptible I/O or a GPU driver call); it ends when that call returns"
            )
            tell(self.app, message, "warning")
        else:
            message = (
                f"PID {target.pid} is still running {FOLLOW_UP_S:g} s after {name}: it may be cleaning "
                f"up, or it handles or ignores {name}; K sends SIGKILL"
            )
            tell(self.app, message, "warning")
        self.app.refresh_now()

    # -- views -----------------------------------------------------------------------------------

    def show_environment(self) -> None:
        proc = self.process
        if proc is None:
            tell(self.app, "no process selected", "warning", 3)
            return
        self.show_environment_of(proc.pid, proc.user, proc.command)

    def show_environment_of(self, pid: int, user: str | None, command: str | None) -> None:
        from tui.screens.environ import EnvironScreen
        from tui.sources.environ import read_environ

        self.app.push_screen(EnvironScreen(read_environ(pid), user, command))

    def show_tree(self) -> None:
        from tui.screens.tree import TreeScreen

        app = self.app
        proc = self.process

        def processes() -> tuple[GpuProcess, ...]:
            machine = app.machine
            return () if machine is None else machine.processes

        app.push_screen(TreeScreen(processes, app.interval, select_pid=None if proc is None else proc.pid))

    def show_metrics(self) -> None:
        from tui.screens.process_metrics import ProcessMetricsScreen, ProcessRef

        app = self.app
        proc = self.process
        if proc is None:
            tell(app, "no process selected", "warning", 3)
            return
        if proc.gpu_index < 0:
            tell(
                app,
                f"PID {proc.pid} is on no GPU: no GPU metrics to chart (t shows where it sits)",
                "warning",
            )
            return

        def state() -> tuple[MachineSnapshot | None, MachineHistory, float]:
            return app.machine, app.history, app.interval

        app.push_screen(ProcessMetricsScreen(ProcessRef(proc.gpu_index, proc.pid, proc.started_at), state))

    # -- filters ---------------------------------------------------------------------------------

    def toggle_filter(self, kind: str) -> None:
        """``kind``: "gpu", "user" or "pid": show only the selected process's, or everything again."""
        app = self.app
        current = app.process_filter
        proc = self.process
        if kind == "gpu":
            index = None if proc is None or proc.gpu_index < 0 else proc.gpu_index
            new = current.toggled_gpu(index)
            off, what = current.gpus is not None, f"GPU {index}"
        elif kind == "user":
            user = None if proc is None else proc.user
            new = current.toggled_user(user)
            off, what = current.users is not None, f"user {user}"
        elif kind == "pid":
            pid = None if proc is None else proc.pid
            new = current.toggled_pid(pid)
            off, what = current.pids is not None, f"PID {pid}"
        else:
            raise ValueError(f"unknown filter {kind!r}")
        if new == current:
            tell(app, f"select a process with a {kind} to filter on", "warning", 3)
            return
        app.process_filter = new
        tell(
            app,
            f"filter off: every {kind} shown" if off else f"showing {what} only (the same key shows all)",
            timeout=3,
        )
        app.refresh_filters()


__all__ = ["FOLLOW_UP_S", "RowLike", "Selection", "process_of_row"]
