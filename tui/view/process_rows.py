"""The process list's rows: NVML's GPU processes merged with the training processes that publish their
anatomy (a publisher that holds no GPU memory, or runs where NVML is missing, still gets a row), plus
sorting and filtering. Pure functions, no Textual, so they are cheap to test."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from anatomy.vocabulary import PublisherState
from tui.sources.model import GpuProcess, MachineSnapshot

if TYPE_CHECKING:  # the anatomy side (its protocol, ~25 ms to import) is not needed to draw the first frame
    from tui.sources.anatomy_source import TrainingProcess


@dataclass(frozen=True)
class ProcessRow:
    key: str
    pid: int
    gpu_index: int | None = None
    type: str = "-"
    gpu_memory: int | None = None
    sm_util: int | None = None  # NVML's per-process samples; None where the GPU does not sample
    memory_bw_util: int | None = None
    user: str | None = None
    command: str | None = None
    cpu_percent: float | None = None
    host_rss: int | None = None
    running_time_s: float | None = None
    alive: bool = True
    training_state: PublisherState | None = None  # None: does not publish its anatomy
    rank: int | None = None

    @property
    def publishes(self) -> bool:
        return self.training_state is not None


@dataclass(frozen=True)
class SortColumn:
    key: str
    label: str


# The first is the default: processes that publish their anatomy (the training jobs) first, then by GPU
# memory, so a training job is on screen even in an 80x24 pane full of inference servers.
TRAINING_FIRST = "training_first"
SORT_COLUMNS: tuple[SortColumn, ...] = (
    SortColumn(TRAINING_FIRST, "◆ first, GPU MEM"),
    SortColumn("gpu_memory", "GPU MEM"),
    SortColumn("sm_util", "SM%"),
    SortColumn("cpu_percent", "CPU%"),
    SortColumn("host_rss", "HOST MEM"),
    SortColumn("running_time_s", "TIME"),
    SortColumn("pid", "PID"),
    SortColumn("gpu_index", "GPU"),
    SortColumn("user", "USER"),
    SortColumn("command", "COMMAND"),
)
SORT_KEYS: tuple[str, ...] = tuple(c.key for c in SORT_COLUMNS)
# Numbers read best largest first; names alphabetically.
_DESCENDING_BY_DEFAULT = {"gpu_memory", "sm_util", "cpu_percent", "host_rss", "running_time_s"}
# Interpreters and launchers whose first argument is the program a reader wants to see.
LAUNCHERS = ("python", "pypy", "torchrun", "accelerate", "deepspeed", "bash", "sh", "node", "ruby", "perl")


def row_key(gpu_index: int | None, pid: int) -> str:
    return f"host:{pid}" if gpu_index is None else f"gpu{gpu_index}:{pid}"


def build_rows(
    machine: MachineSnapshot | None,
    training: Sequence[TrainingProcess],
    host_figures: Mapping[int, GpuProcess] | None = None,
) -> list[ProcessRow]:
    """One row per (GPU, PID) from NVML, then one per publishing PID that NVML does not list.
    ``host_figures`` supplies user/command/CPU/RSS for those extra PIDs where the caller looked them up."""
    by_pid = {t.pid: t for t in training}
    rows: list[ProcessRow] = []
    seen: set[int] = set()
    for p in machine.processes if machine is not None else ():
        t = by_pid.get(p.pid)
        rows.append(_from_gpu_process(row_key(p.gpu_index, p.pid), p, t))
        seen.add(p.pid)
    figures = host_figures or {}
    for pid, t in sorted(by_pid.items()):
        if pid in seen:
            continue
        host = figures.get(pid)
        if host is not None:
            rows.append(_from_gpu_process(row_key(None, pid), host, t, on_gpu=False))
        else:
            alive = t.state not in (PublisherState.EXITED, PublisherState.OOM)
            rows.append(
                ProcessRow(
                    key=row_key(None, pid),
                    pid=pid,
                    alive=alive,
                    training_state=t.state,
                    rank=t.rank,
                    command=t.hello.model_class if t.hello is not None else None,
                )
            )
    return rows


def _from_gpu_process(key: str, p: GpuProcess, t: TrainingProcess | None, on_gpu: bool = True) -> ProcessRow:
    return ProcessRow(
        key=key,
        pid=p.pid,
        gpu_index=p.gpu_index if on_gpu else None,
        type=p.type if on_gpu else "-",
        gpu_memory=p.gpu_memory if on_gpu else None,
        user=p.user,
        command=p.command
        or p.name
        or (t.hello.model_class if t is not None and t.hello is not None else None),
        sm_util=p.sm_util if on_gpu else None,
        memory_bw_util=p.memory_bw_util if on_gpu else None,
        cpu_percent=p.cpu_percent,
        host_rss=p.host_rss,
        running_time_s=p.running_time_s,
        alive=p.alive,
        training_state=t.state if t is not None else None,
        rank=t.rank if t is not None else None,
    )


def matches(row: ProcessRow, needle: str) -> bool:
    """Case-insensitive substring of the command, the user or the PID."""
    if not needle:
        return True
    needle = needle.casefold()
    return any(needle in field.casefold() for field in (row.command or "", row.user or "", str(row.pid)))


def filter_rows(rows: Iterable[ProcessRow], needle: str) -> list[ProcessRow]:
    return [r for r in rows if matches(r, needle)]


def sort_rows(rows: Iterable[ProcessRow], column: str, reverse: bool = False) -> list[ProcessRow]:
    """Sort by ``column``; N/A values go last whatever the direction; ties by GPU then PID. The
    training-first order puts publishing processes first, each group by GPU memory."""
    if column == TRAINING_FIRST:
        rows = list(rows)
        publishing = sort_rows([r for r in rows if r.publishes], "gpu_memory", reverse)
        return publishing + sort_rows([r for r in rows if not r.publishes], "gpu_memory", reverse)
    descending = (column in _DESCENDING_BY_DEFAULT) != reverse
    present = [r for r in rows if getattr(r, column) is not None]
    missing = [r for r in rows if getattr(r, column) is None]

    def tie(r: ProcessRow) -> tuple[int, int]:
        return (r.gpu_index if r.gpu_index is not None else 1 << 30, r.pid)

    present.sort(key=tie)
    present.sort(key=lambda r: _sortable(getattr(r, column)), reverse=descending)
    missing.sort(key=tie)
    return present + missing


_PATH = re.compile(r"^(?:~|\.{1,2}|[\w.+-]+)?(?:/[^/\s]+)+$")


def _basename(word: str) -> str:
    """The last part of a path (``/opt/venv/bin/python``, ``.venv/bin/python``, ``./train.py``); any
    other word as it is (``[/]`` is not a path)."""
    return word.rsplit("/", 1)[-1] if _PATH.match(word) else word


def readable_command(command: str | None) -> str | None:
    """A command line as a reader wants it in a narrow column: programs by their name, not their path
    (``/opt/venv/bin/python /home/a/proj/train.py --lr 3e-4`` -> ``python train.py --lr 3e-4``);
    options and their values as they are."""
    if not command:
        return command
    words = command.split(" ")
    words[0] = _basename(words[0])
    if words[0].startswith(LAUNCHERS):
        for i in range(1, len(words)):
            word = words[i]
            if not word or word.startswith("-"):
                if word in ("-m", "-c"):
                    break  # a module name or code follows, never a path
                continue
            words[i] = _basename(word)
            break
    return " ".join(words)


def _sortable(value: Any) -> Any:
    return value.casefold() if isinstance(value, str) else value


def default_descending(column: str) -> bool:
    return column in _DESCENDING_BY_DEFAULT
