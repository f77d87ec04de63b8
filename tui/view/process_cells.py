"""The process table's cells (pure functions, rich.text only): the poll worker makes them for the
monitor (``tui.view.poll``), the start-up frame for its one frame."""

from __future__ import annotations

from rich.text import Text

from anatomy.vocabulary import PublisherState
from tui import format as fmt
from tui.view.process_rows import LAUNCHERS, ProcessRow, readable_command

COLUMNS: tuple[tuple[str, str], ...] = (
    ("glyph", " "),
    ("gpu", "GPU"),
    ("pid", "PID"),
    ("user", "USER"),
    ("type", "TYPE"),
    ("gpu_memory", "GPU MEM"),
    ("sm", "SM%"),
    ("mbw", "MBW%"),
    ("cpu", "CPU%"),
    ("host_mem", "HOST MEM"),
    ("time", "TIME"),
    ("command", "COMMAND"),
)
COLUMN_KEYS: tuple[str, ...] = tuple(k for k, _ in COLUMNS)
# NVML's per-process samples take ten cells; a pane narrower than this gives them to the command line,
# which must stay readable (program, script and arguments) in a side-by-side pane.
SAMPLE_COLUMNS = ("sm", "mbw")
SAMPLES_FROM = 100


def columns_for(width: int) -> tuple[tuple[str, str], ...]:
    """The columns a process table ``width`` cells wide shows."""
    if width >= SAMPLES_FROM:
        return COLUMNS
    return tuple(c for c in COLUMNS if c[0] not in SAMPLE_COLUMNS)


def picker(columns: tuple[tuple[str, str], ...]) -> tuple[int, ...]:
    """Indices into a full row of cells (COLUMNS order) of ``columns``."""
    return tuple(COLUMN_KEYS.index(key) for key, _ in columns)


def picked(cells: tuple[Text, ...], pick: tuple[int, ...]) -> tuple[Text, ...]:
    """The cells of a full row (COLUMNS order) at the indices ``pick`` (``picker``'s)."""
    return tuple(cells[i] for i in pick)


JUSTIFY = {
    "gpu": "right",
    "pid": "right",
    "gpu_memory": "right",
    "sm": "right",
    "mbw": "right",
    "cpu": "right",
    "host_mem": "right",
    "time": "right",
}
ANATOMY_GLYPH = "◆"
GAP = 1  # between columns: every cell the command can have counts in a half-width pane
# The share of a shortened command kept from its start (the program and script); the rest is its end.
HEAD_SHARE = 0.6
TAIL_MIN = 8  # cells of a command line's end kept even when its program takes the rest

# One cell each, so the glyph column stays one cell wide (an OOM row also says OOM in its command).
_GLYPHS: dict[PublisherState, tuple[str, str]] = {
    PublisherState.LIVE: (ANATOMY_GLYPH, "bold green"),
    PublisherState.OOM: ("×", "bold red"),  # Latin-1: in every terminal font
    PublisherState.EXITED: ("◇", "bright_black"),
    PublisherState.ERROR: ("!", "bold yellow"),
}


OOM_MARK = "OOM "


def program_length(command: str) -> int:
    """Characters of ``command`` up to the end of its program: the executable, and for an interpreter
    the script or module it runs (``python -u train.py``, ``python -m pkg.mod``)."""
    words = command.split(" ")
    end = len(words[0])
    if not words[0].startswith(LAUNCHERS):
        return end
    takes_value = False
    for word in words[1:]:
        end += 1 + len(word)
        if takes_value or not word.startswith("-"):
            return end
        takes_value = word in ("-m", "-c")
    return end


def elide_middle(text: Text, width: int) -> Text:
    """``text`` in ``width`` cells, its middle replaced by an ellipsis: a command line keeps its program
    and script (the start) and its last arguments (the end)."""
    if text.cell_len <= width:
        return text
    if width <= 1:
        return Text("…"[:width])
    keep = width - 1
    plain = text.plain
    lead = len(OOM_MARK) if plain.startswith(OOM_MARK) else 0
    program = lead + program_length(plain[lead:])
    head = max(1, round(keep * HEAD_SHARE))
    if program > head:  # the program and script first, short of a few cells of the end
        head = max(head, min(program, keep - min(TAIL_MIN, keep // 3)))
    tail = keep - head
    out = text[:head]
    out.append("…")
    if tail > 0:
        out.append_text(text[len(plain) - tail :])
    return out


def _right(value: str) -> Text:
    return Text(value, justify="right", style="bright_black" if value == fmt.NA else "")


def glyph_for(state: PublisherState | None) -> Text:
    if state is None:
        return Text("")
    glyph, style = _GLYPHS.get(state, (ANATOMY_GLYPH, "green"))
    return Text(glyph, style=style)


def shown_values(row: ProcessRow, samples: bool = True) -> tuple[object, ...]:
    """What the row's cells show, as plain values: rows with equal values have equal cells (running
    time and CPU % move every refresh in the row, rarely on screen). Without ``samples`` (their
    columns hidden) SM % and memory-bandwidth % are left out, so their moves rebuild no cell."""
    return (
        row.training_state,
        row.gpu_index,
        row.pid,
        row.user,
        row.type,
        fmt.fmt_bytes(row.gpu_memory),
        fmt.fmt_percent(row.sm_util) if samples else "",
        fmt.fmt_percent(row.memory_bw_util) if samples else "",
        fmt.fmt_percent(row.cpu_percent, 1),
        fmt.fmt_bytes(row.host_rss),
        fmt.fmt_elapsed(row.running_time_s),
        row.command,
        row.alive,
        row.rank,
    )


def process_cells(row: ProcessRow) -> tuple[Text, ...]:
    return cells_of(shown_values(row))


def cells_of(values: tuple[object, ...]) -> tuple[Text, ...]:
    state, gpu_index, pid, user, type_, gpu_memory, sm, mbw, cpu, rss, elapsed, command, alive, _rank = values
    # The rank is in the anatomy pane and its ranks table; here every cell goes to the command line.
    command_text = Text(style="" if alive else "strike bright_black")
    if state is PublisherState.OOM:
        command_text.append(OOM_MARK, style="bold red")
    shown = readable_command(command) if isinstance(command, str) else None
    command_text.append(shown or fmt.NA)
    return (
        glyph_for(state if isinstance(state, PublisherState) else None),
        Text("-" if gpu_index is None else str(gpu_index), justify="right"),
        Text(str(pid), justify="right"),
        Text(str(user or fmt.NA)),
        Text(str(type_)),
        _right(str(gpu_memory)),
        _right(str(sm)),
        _right(str(mbw)),
        _right(str(cpu)),
        _right(str(rss)),
        _right(str(elapsed)),
        command_text,
    )
