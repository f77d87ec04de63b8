"""What the monitor's process keys do (the app's action methods call these): signals with a
confirmation, the environment, the tree, the metrics screen, the filters and the GPU history.

Kept out of ``tui/app.py`` so the app stays about layout and polling. Each function takes the running
app, and uses of it: ``machine``, ``host_figures``, ``interval``, ``history`` (MachineHistory),
``process_filter`` (ProcessFilter), ``action_messages``, ``refresh_now()``, ``refresh_filters()``,
and Textual's ``notify``, ``push_screen``, ``set_timer``, ``query_one``. Every outcome is told in a
notification (and kept in ``app.action_messages``, newest last, for scripts and tests); nothing here
raises into the app.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tui.sources.filters import ProcessFilter
from tui.sources.history import MachineHistory
from tui.sources.model import GpuProcess, MachineSnapshot

# How long after a signal the monitor checks whether the process is gone.
FOLLOW_UP_S = 1.0


def tell(app: Any, message: str, severity: str = "information", timeout: float = 6.0) -> None:
    messages = getattr(app, "action_messages", None)
    if isinstance(messages, list):
        messages.append(message)
        del messages[:-50]
    app.notify(message, severity=severity, timeout=timeout)


def selected_process(app: Any) -> GpuProcess | None:
    """The GPU process (or, for a row without a GPU, the host's figures) under the table's cursor."""
    from tui.widgets.process_table import ProcessTable

    row = app.query_one(ProcessTable).selected_row
    if row is None:
        return None
    machine: MachineSnapshot | None = app.machine
    if row.gpu_index is not None and machine is not None:
        for proc in machine.processes:
            if proc.pid == row.pid and proc.gpu_index == row.gpu_index:
                return proc
    figures: Mapping[int, GpuProcess] = getattr(app, "host_figures", {}) or {}
    if row.pid in figures:
        return figures[row.pid]
    gpu_index = -1 if row.gpu_index is None else row.gpu_index
    return GpuProcess(gpu_index=gpu_index, pid=row.pid, type=row.type, user=row.user, command=row.command)


# -- signals -------------------------------------------------------------------------------------


def signal_selected(app: Any, name: str) -> None:
    proc = selected_process(app)
    if proc is None:
        tell(app, "no process selected", "warning", 3)
        return
    request_signal(app, proc.pid, proc.started_at, name)


def request_signal(app: Any, pid: int, started_at: float | None, name: str) -> None:
    """Identify ``pid`` now (it must still be the process the table showed), check the policy, ask, send."""
    from tui.sources import signals
    from tui.widgets.signal_dialog import SignalDialog

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
            app.set_timer(FOLLOW_UP_S, lambda: _follow_up(app, target, sig))
            app.refresh_now()

    app.push_screen(SignalDialog(target, name), answered)


def _follow_up(app: Any, target: Any, sig: int) -> None:
    from tui.sources import signals

    name = signals.signal_name(sig)
    if not signals.still_running(target):
        tell(app, f"PID {target.pid} ({target.name}) has exited")
    elif name == "SIGKILL":
        message = (
            f"PID {target.pid} is still there {FOLLOW_UP_S:g} s after SIGKILL: stuck in the kernel "
            "(uninterruptible I/O or a GPU driver call); it ends when that call returns"
        )
        tell(app, message, "warning")
    else:
        message = (
            f"PID {target.pid} is still running {FOLLOW_UP_S:g} s after {name}: it may be cleaning up, "
            f"or it handles or ignores {name}; K sends SIGKILL"
        )
        tell(app, message, "warning")
    app.refresh_now()


# -- views ---------------------------------------------------------------------------------------


def show_environment(app: Any) -> None:
    proc = selected_process(app)
    if proc is None:
        tell(app, "no process selected", "warning", 3)
        return
    show_environment_of(app, proc.pid, proc.user, proc.command)


def show_environment_of(app: Any, pid: int, user: str | None, command: str | None) -> None:
    from tui.sources.environ import read_environ
    from tui.widgets.environ_screen import EnvironScreen

    app.push_screen(EnvironScreen(read_environ(pid), user, command))


def show_tree(app: Any) -> None:
    from tui.widgets.tree_screen import TreeScreen

    proc = selected_process(app)

    def processes() -> tuple[GpuProcess, ...]:
        machine = app.machine
        return () if machine is None else machine.processes

    app.push_screen(TreeScreen(processes, app.interval, select_pid=None if proc is None else proc.pid))


def show_metrics(app: Any) -> None:
    from tui.widgets.process_metrics import ProcessMetricsScreen, ProcessRef

    proc = selected_process(app)
    if proc is None:
        tell(app, "no process selected", "warning", 3)
        return
    if proc.gpu_index < 0:
        tell(app, f"PID {proc.pid} is on no GPU: no GPU metrics to chart (t shows where it sits)", "warning")
        return

    def state() -> tuple[MachineSnapshot | None, MachineHistory, float]:
        return app.machine, app.history, app.interval

    app.push_screen(ProcessMetricsScreen(ProcessRef(proc.gpu_index, proc.pid, proc.started_at), state))


# -- filters -------------------------------------------------------------------------------------


def toggle_filter(app: Any, kind: str) -> None:
    """``kind``: "gpu", "user" or "pid": show only the selected process's, or everything again."""
    current: ProcessFilter = app.process_filter
    proc = selected_process(app)
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


def check_filter(app: Any) -> None:
    """Say so when --only names a GPU the machine does not have (a typo shows an empty table)."""
    machine = app.machine
    if machine is None or not machine.nvml.available:
        return
    unknown = app.process_filter.unknown_gpus(machine.gpus)
    if unknown:
        have = ", ".join(str(g.index) for g in machine.gpus) or "none"
        names = ",".join(str(i) for i in unknown)
        tell(app, f"--only {names}: no such GPU here (GPUs: {have})", "warning", 10)


def toggle_history(app: Any) -> None:
    from tui.widgets.gpu_history import GpuHistory

    panel = app.query_one(GpuHistory)
    panel.display = not panel.display
    app.refresh_filters()


__all__ = [
    "FOLLOW_UP_S",
    "check_filter",
    "request_signal",
    "selected_process",
    "show_environment",
    "show_environment_of",
    "show_metrics",
    "show_tree",
    "signal_selected",
    "tell",
    "toggle_filter",
    "toggle_history",
]
