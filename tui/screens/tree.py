"""The process tree view (``t``): every GPU process with its parents up to the root and its children, so
a rank shows its launcher and its data-loader workers. The signal keys and ``e`` act on the selected
node here too (posted as ``tui.screens.process_requests`` messages): stopping the launcher stops the
whole job."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen

from tui import format as fmt
from tui.sanitize import clean
from tui.screens.process_requests import EnvironmentRequested, SignalRequested
from tui.sources.model import GpuProcess
from tui.sources.tree import ANCESTOR, CHILD, GPU, ProcessTree, TreeRow
from tui.view.process_cells import elide_middle
from tui.view.process_rows import readable_command
from tui.widgets.line_table import LineTable
from tui.widgets.text_static import TextStatic

SIGNAL_TIP = "send SIGTERM / SIGKILL / SIGINT to the selected process (asks first)"
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("pid", "PID", "right"),
    ("user", "USER", "left"),
    ("gpus", "GPU", "left"),
    ("gpu_memory", "GPU MEM", "right"),
    ("cpu", "CPU%", "right"),
    ("host_mem", "HOST MEM", "right"),
    ("time", "TIME", "right"),
    ("command", "COMMAND (tree)", "left"),
)


def tree_prefix(row: TreeRow) -> str:
    """``│  ├─ `` etc. for ``row``: a bar for each ancestor level that has later siblings."""
    if row.depth == 0:
        return ""
    bars = "".join("   " if last else "│  " for last in row.last[1:-1])
    return bars + ("└─ " if row.last[-1] else "├─ ")


def tree_cells(row: TreeRow) -> tuple[Text, ...]:
    style = {GPU: "bold", ANCESTOR: "", CHILD: "bright_black"}.get(row.role, "")
    if not row.alive:
        style = "strike bright_black"
    command = Text(tree_prefix(row), style="bright_black")
    command.append(clean(readable_command(row.command) or row.name or fmt.NA), style=style)
    if not row.alive:
        command.append("  (not on this host: exited, or another PID namespace)", style="bright_black")
    gpus = ",".join(str(i) for i in row.gpus)

    def right(value: str) -> Text:
        return Text(value, justify="right", style="bright_black" if value == fmt.NA else "")

    return (
        Text(str(row.pid), justify="right", style=style),
        Text(clean(row.user or fmt.NA)),
        Text(gpus or "-", style="bold green" if gpus else "bright_black"),
        right(fmt.fmt_bytes(row.gpu_memory) if row.gpus else "-"),
        right(fmt.fmt_percent(row.cpu_percent, 1)),
        right(fmt.fmt_bytes(row.host_rss)),
        right(fmt.fmt_elapsed(row.running_time_s)),
        command,
    )


class TreeTable(LineTable):
    def __init__(self, **kwargs: object) -> None:
        # The command takes what the other columns leave, its middle elided (tree, program, script and
        # last arguments stay), as in the process table.
        super().__init__(COLUMNS, cursor=True, flex="command", elide=elide_middle, **kwargs)  # type: ignore[arg-type]
        self.rows_by_key: dict[str, TreeRow] = {}

    def show(self, rows: Sequence[TreeRow]) -> None:
        self.rows_by_key = {str(r.pid): r for r in rows}
        self.set_rows([(str(r.pid), tree_cells(r)) for r in rows])

    @property
    def selected(self) -> TreeRow | None:
        key = self.cursor_key
        return None if key is None else self.rows_by_key.get(key)


class TreeScreen(Screen[None]):
    """``processes()`` gives the GPU processes of the latest snapshot; the tree is rebuilt from /proc every
    ``interval`` seconds in a worker thread. ``select_pid``: the process to put the cursor on."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,t,q", "close", "Back", id="tree.close", tooltip="back to the monitor"),
        Binding("T", "signal('terminate')", "SIGTERM", id="tree.terminate", tooltip=SIGNAL_TIP),
        Binding("K", "signal('kill')", "SIGKILL", id="tree.kill", tooltip=SIGNAL_TIP),
        Binding("I", "signal('interrupt')", "SIGINT", id="tree.interrupt", tooltip=SIGNAL_TIP),
        Binding("e", "environment", "Env", id="tree.environment", tooltip="its environment"),
        Binding("j", "move(1)", "Down", show=False, id="tree.down", tooltip="select the next process"),
        Binding("k", "move(-1)", "Up", show=False, id="tree.up", tooltip="select the previous process"),
    ]
    CSS_PATH = "screens.tcss"

    def __init__(
        self,
        processes: Callable[[], Sequence[GpuProcess]],
        interval: float,
        select_pid: int | None = None,
        tree: ProcessTree | None = None,
    ) -> None:
        super().__init__()
        self._processes = processes
        self.interval = max(0.5, interval)
        self.select_pid = select_pid
        self.process_tree = tree or ProcessTree()
        self.builds = 0  # completed rebuilds, for tests

    def compose(self) -> ComposeResult:
        yield TextStatic(Text("Process tree  ", style="bold"), id="tree-title")
        yield TreeTable(id="tree")
        yield TextStatic(
            Text(
                " bold: on a GPU · grey: its children · ↑ ↓ select · T K I signal · e environment · "
                "t or escape returns",
                style="bright_black",
            ),
            id="tree-keys",
        )

    def on_mount(self) -> None:
        self.query_one(TreeTable).focus()
        self._rebuild()
        self.set_interval(self.interval, self._rebuild, name="tree-refresh")

    @work(thread=True, exclusive=True, group="tree")
    def _rebuild(self) -> None:
        try:
            rows = self.process_tree.build(self._processes())
        except Exception as exc:  # /proc oddities must not take the view down
            self.app.call_from_thread(self._show_error, f"{type(exc).__name__}: {exc}")
            return
        self.app.call_from_thread(self._show, rows)

    def _show(self, rows: list[TreeRow]) -> None:
        if not self.is_attached:
            return
        table = self.query_one(TreeTable)
        table.show(rows)
        if self.select_pid is not None and str(self.select_pid) in table.rows_by_key:
            table.move_cursor(table.get_row_index(str(self.select_pid)))
            self.select_pid = None
        on_gpu = sum(1 for r in rows if r.role == GPU)
        title = Text("Process tree  ", style="bold")
        if rows:
            title.append(f"{on_gpu} on GPUs, {len(rows)} processes", style="bright_black")
        else:
            title.append("no GPU process to show (NVML lists none)", style="yellow")
        self.query_one("#tree-title", TextStatic).show_text(title)
        self.builds += 1

    def _show_error(self, message: str) -> None:
        if self.is_attached:
            self.query_one("#tree-title", TextStatic).show_text(Text(f"Process tree: {message}", style="red"))

    @property
    def selected(self) -> TreeRow | None:
        return self.query_one(TreeTable).selected

    def action_close(self) -> None:
        self.dismiss(None)

    def action_move(self, delta: int) -> None:
        table = self.query_one(TreeTable)
        if delta > 0:
            table.action_cursor_down()
        else:
            table.action_cursor_up()

    def action_signal(self, name: str) -> None:
        row = self.selected
        if row is None:
            self.notify("no process selected", timeout=3)
            return
        self.post_message(SignalRequested(row.pid, row.started_at, name))

    def action_environment(self) -> None:
        row = self.selected
        if row is None:
            self.notify("no process selected", timeout=3)
            return
        self.post_message(EnvironmentRequested(row.pid, row.user, row.command))


__all__ = ["TreeScreen", "TreeTable", "tree_cells", "tree_prefix"]
