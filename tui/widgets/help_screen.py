"""The help screen: every key the monitor answers to, and what every figure of the anatomy pane means.

KEYS is the contract with the app: each entry is a key or gesture that works (a test presses each one).
The words come from the shared vocabulary (``COMPONENT_HELP``: one sentence per component) and from
GLOSSARY below, one entry per figure or word the anatomy pane shows. It scrolls: at 60x20 the arrows,
PgUp/PgDn, Home/End and the mouse wheel move through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from anatomy.vocabulary import COMPONENT_HELP

# (keys as shown, what they do). The app's bindings implement exactly these; a test presses each one.
KEYS: tuple[tuple[str, str], ...] = (
    ("↑ ↓  j k", "move the selection (scroll the anatomy pane)"),
    ("PgUp PgDn Home End", "move a page, or to the first / last process"),
    ("← →", "scroll a table sideways when it is wider than its pane"),
    ("wheel, Shift+wheel", "scroll up and down; sideways with Shift"),
    ("click", "select a process; a key in the bottom bar runs it"),
    ("tab", "switch pane: processes / anatomy (one at a time below 160 cols)"),
    ("f", "GPU table: every field, two lines per GPU / compact, one line"),
    ("s", "sort by the next column (first: ◆ training jobs, then GPU memory)"),
    ("S", "reverse the sort order"),
    ("/", "filter processes by command, user or PID"),
    ("enter", "keep the filter; on a process: its metrics over time"),
    ("escape", "clear the filter; close this help"),
    ("p", "pause / resume refreshing"),
    ("+", "refresh less often (longer interval)"),
    ("-", "refresh more often (shorter interval)"),
    ("x", "dismiss the shown OOM record"),
    ("t", "process tree: GPU processes with their parents and children"),
    ("T  K  I", "send SIGTERM / SIGKILL / SIGINT to the selected process (asks first)"),
    ("e", "the selected process's environment (if /proc/PID/environ is readable)"),
    ("u  g  P", "only the selected process's user / GPU / PID; again: all"),
    ("h", "GPU history: utilization and memory sparklines per GPU"),
    ("l", "anatomy pane: the job's plan vs what was measured (plan --like)"),
    ("?", "show this help"),
    ("q  ctrl+q  ctrl+c", "quit"),
)

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


def help_table() -> Table:
    return _table(KEYS, 20)


def glossary_table() -> Table:
    return _table(GLOSSARY, 24)


def components_table() -> Table:
    return _table([(c.label, sentence) for c, sentence in COMPONENT_HELP.items()], 24)


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("question_mark", "close", "Close", show=False),
        Binding("q", "close", "Close", show=False),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 100; max-width: 100%; height: auto; max-height: 100%;
        border: round $accent; padding: 0 1; background: $surface;
    }
    HelpScreen > VerticalScroll > Static { width: 1fr; }
    HelpScreen .help-title { text-style: bold; margin: 1 0 0 0; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body"):
            yield Static(Text("anatomy-top keys", style="bold"))
            yield Static(help_table(), id="help-keys")
            yield Static(Text("What the anatomy pane shows"), classes="help-title")
            yield Static(glossary_table(), id="help-glossary")
            yield Static(Text("Memory components"), classes="help-title")
            yield Static(components_table(), id="help-components")
            yield Static(Text("↑ ↓ PgUp PgDn scroll · escape, ? or q closes this help", style="bright_black"))

    def on_mount(self) -> None:
        self.query_one("#help-body").focus()

    def action_close(self) -> None:
        self.dismiss(None)
