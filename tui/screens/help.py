"""The help screen: every key the monitor answers to, and what every figure of the anatomy pane means.

The key list is generated from the bindings themselves (``tui.monitor_keys``, and those widgets declare): each
binding with an id and a tooltip is a row, or part of one (a test presses each listed key). The other
words come from the shared vocabulary (``COMPONENT_HELP``: one sentence per component) and from
GLOSSARY below, one entry per figure or word the anatomy pane shows. It scrolls: at 60x20 the arrows,
PgUp/PgDn, Home/End and the mouse wheel move through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, NamedTuple

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen
from textual.widgets import Static

from anatomy.vocabulary import COMPONENT_HELP
from tui.widgets.key_bar import key_label


class KeyRow(NamedTuple):
    """One line of the help's key list: its id (``row_id``), the keys as shown, what they do."""

    id: str
    keys: str
    what: str


# Keys no binding with an id declares: the tables' own cursor keys (tui.widgets.line_table) and the mouse.
GESTURES: dict[str, KeyRow] = {
    "page": KeyRow("page", "PgUp PgDn Home End", "move a page, or to the first / last process"),
    "sideways": KeyRow("sideways", "← →", "scroll a table sideways when it is wider than its pane"),
    "wheel": KeyRow("wheel", "wheel, Shift+wheel", "scroll up and down; sideways with Shift"),
    "click": KeyRow("click", "click", "select a process; a key in the bottom bar runs it"),
}
# Keys bound elsewhere that do what a row's bindings do (before, after the row's own keys): the tables'
# arrows move as j and k do; Textual's App binds ctrl+q to quit.
ALSO_BOUND: dict[str, tuple[str, str]] = {"move": ("↑ ↓", ""), "quit": ("", "ctrl+q")}
# The rows in the order the help lists them: binding rows (``row_id``) and gestures. A binding
# row missing here is listed after these, never left out.
ORDER: tuple[str, ...] = (
    "move",
    "page",
    "sideways",
    "wheel",
    "click",
    "switch-pane",
    "gpu-layout",
    "sort",
    "reverse-sort",
    "filter",
    "metrics",
    "escape",
    "pause",
    "slower",
    "faster",
    "dismiss",
    "tree",
    "signal",
    "environment",
    "filter-by",
    "gpu-history",
    "plan-like",
    "help",
    "quit",
)


def row_id(binding: Binding) -> str | None:
    """The help row a binding belongs to: its id up to the first dot."""
    return None if binding.id is None else binding.id.split(".", 1)[0]


def bindings_of(nodes: Iterable[DOMNode]) -> list[Binding]:
    """The bindings with an id and a tooltip that ``nodes`` (an app, the widgets on its main screen)
    declare, their base classes' too (Textual merges those), each class's once, in the order met."""
    seen: set[type] = set()
    found: list[Binding] = []
    for node in nodes:
        for cls in type(node).__mro__:
            if cls in seen:
                continue
            seen.add(cls)
            declared = vars(cls).get("BINDINGS", ())
            found += [b for b in declared if isinstance(b, Binding) and b.id and b.tooltip]
    return found


def key_rows(bindings: Iterable[Binding]) -> tuple[KeyRow, ...]:
    """The help's key list: one row per ``row_id``, its keys in the bindings' order."""
    keys: dict[str, list[str]] = {}
    what: dict[str, str] = {}
    for binding in bindings:
        row = row_id(binding)
        if row is None:
            continue
        keys.setdefault(row, []).append(key_label(binding.key))
        what.setdefault(row, binding.tooltip)
    rows: list[KeyRow] = []
    for row in [*ORDER, *(r for r in keys if r not in ORDER)]:
        if row in GESTURES:
            rows.append(GESTURES[row])
        elif row in keys:
            before, after = ALSO_BOUND.get(row, ("", ""))
            rows.append(KeyRow(row, "  ".join(k for k in (before, *keys[row], after) if k), what[row]))
    return tuple(rows)


def monitor_key_rows(app: App[Any]) -> tuple[KeyRow, ...]:
    """What the help lists for ``app``: its own keys and those of the widgets on its main screen."""
    return key_rows(bindings_of([app, *app.screen_stack[0].query("*")]))


# (word or figure as the pane shows it, what it means).
GLOSSARY: tuple[tuple[str, str], ...] = (
    (
        "◆  ×  ◇  !",
        "publishes its anatomy (the hook runs in it) · died of out-of-memory (its last "
        "anatomy kept, x dismisses it) · exited · its anatomy could not be read",
    ),
    (
        "SM%  MBW%",
        "a process's share of time keeping the SMs busy / reading or writing GPU memory (NVML's "
        "per-process samples; 0% = not busy lately; N/A where the GPU does not sample processes)",
    ),
    (
        "At peak",
        "what each component held at the moment of the step's memory peak; the rows add up to the total line",
    ),
    ("Share", "the row's part of that total"),
    (
        "Max in step",
        "each component at its own maximum in the step; maxima come at different moments, "
        "so they can add up to more than the peak",
    ),
    (
        "B/param",
        "Max in step divided by the parameter count, for the components that grow with the "
        "model (none for CUDA context, allocator cache, runtime, inputs, unattributed)",
    ),
    (
        "Guide",
        "the bytes per parameter the training-anatomy guide gives for this precision and "
        "optimizer (fp32 AdamW: weights 4, optimizer states 8, gradients 4); '—' where it gives none",
    ),
    (
        "Peak … in backward",
        "the step's highest memory and the phase it came in (forward, backward, optimizer)",
    ),
    (
        "NVML … = sum of the rows",
        "on a GPU the rows add up to NVML's figure for the process: CUDA "
        "context + allocator cache + the tensors at the step's peak",
    ),
    (
        "GPU MEM vs the peak",
        "NVML counts the whole process (CUDA context, the allocator's cache); the "
        "peak counts tensors only; a CPU job's rows are host memory, not GPU memory",
    ),
    (
        "glibc heap in use",
        "on CPU, the memory the process got from malloc and has not freed: the CPU "
        "counterpart of allocated GPU memory",
    ),
    (
        "split traced at step N",
        "the At peak split comes from a per-operation trace of step N (taken "
        "every few steps, it costs time); the other figures are the latest step's",
    ),
    (
        "Step · fwd · bwd · opt",
        "the step's time and its forward, backward and optimizer phases, with samples/s and tokens/s",
    ),
    (
        "MFU",
        "model FLOPs utilisation: the FLOP/s achieved over the GPU's peak (N/A where the peak is "
        "unknown, e.g. on a CPU)",
    ),
    (
        "Op groups",
        "share of the FLOPs and of the time per group of operations (tensor contractions, "
        "statistical normalizations, element-wise), from a sampled step ('sampled at step N')",
    ),
    (
        "measured/predicted/guide",
        "where a suggestion's number comes from: this run, a model of "
        "this run, or the guide's published figures",
    ),
    (
        "no new snapshot for …",
        "a live job that published nothing new for a while: a stall, a hang, or one long step",
    ),
)


def _table(rows: Sequence[tuple[str, str]], first_width: int) -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2, 0, 0), expand=True)
    table.add_column(style="bold cyan", no_wrap=True, min_width=min(first_width, 14), max_width=first_width)
    table.add_column(ratio=1)
    for keys, what in rows:
        table.add_row(Text(keys), Text(what))
    return table


def help_table(rows: Sequence[KeyRow]) -> Table:
    return _table([(row.keys, row.what) for row in rows], 20)


def glossary_table() -> Table:
    return _table(GLOSSARY, 24)


def components_table() -> Table:
    return _table([(c.label, sentence) for c, sentence in COMPONENT_HELP.items()], 24)


class HelpScreen(ModalScreen[None]):
    """``rows``: the keys to list (``monitor_key_rows``)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "close", "Close", id="help.close", tooltip="close this help"),
    ]
    CSS_PATH = "screens.tcss"

    def __init__(self, rows: Sequence[KeyRow]) -> None:
        super().__init__()
        self.rows = tuple(rows)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(Text("anatomy-top keys", style="bold"))
            yield Static(help_table(self.rows), id="help-keys")
            yield Static(Text("What the anatomy pane shows"), classes="help-title")
            yield Static(glossary_table(), id="help-glossary")
            yield Static(Text("Memory components"), classes="help-title")
            yield Static(components_table(), id="help-components")
            yield Static(Text("↑ ↓ PgUp PgDn scroll · escape, ? or q closes this help", style="bright_black"))

    def on_mount(self) -> None:
        self.query_one("#help-body").focus()

    def action_close(self) -> None:
        self.dismiss(None)
