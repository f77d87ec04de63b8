"""The monitor's own keys: the app's bindings, each with an ``id`` (a keymap can rebind it) and a
``tooltip``, the sentence the help screen (``tui.screens.help``) shows for it.

Their order is the key bar's (those with ``show``); the help orders its rows by the part of the id
before the first dot, which also puts bindings on one row (``signal.kill``, ``signal.terminate``).
Widgets and screens declare their own keys beside the code that answers them (``l`` on the anatomy
pane, the cursor keys on the tables, each screen's keys on the screen).
"""

from __future__ import annotations

from textual.binding import Binding, BindingType

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


def row_id(binding: Binding) -> str | None:
    """The help row a binding belongs to: its id up to the first dot."""
    return None if binding.id is None else binding.id.split(".", 1)[0]


__all__ = ["MONITOR_BINDINGS", "row_id"]
