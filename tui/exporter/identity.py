"""The labels that name one training process's series: ``run_id`` and ``rank``.

``pid`` is deliberately not among them (it lives only on ``anatomy_rank_info``): an elastic restart gives
a rank a new PID but keeps its job, and its series should go on. The job is torchrun's run id
(``TORCHELASTIC_RUN_ID``, shared by every rank on every node). Where there is none — a process started
without a launcher, or torchrun's default id ``none`` that every launch without ``--rdzv-id`` shares — the
exporter names the job after its launcher's PID on this node (``local-<ppid>``: torchrun's agent is the
parent of all its local ranks) or, for a process without a rank, after the process itself
(``local-<pid>``); PIDs as the node numbers them (the kernel's, through ``SO_PEERCRED``), not as a
container does. Two live processes that would still carry the same pair get their PID appended to the run
id (``<run_id>-pid<pid>``), so that no series is ever written twice in one scrape. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from anatomy.protocol import Hello
from tui.sanitize import clean

# torchrun's --rdzv-id default: every launch that does not set one shares it.
SHARED_RUN_IDS = frozenset({"", "none"})
# A label value from another process is capped: Prometheus stores every distinct value.
MAX_LABEL_CHARS = 128


def label_value(text: str | None) -> str:
    """An untrusted string as a label value: sanitised, capped, "" for none (Prometheus: no label)."""
    if text is None:
        return ""
    value = clean(text)
    return value if len(value) <= MAX_LABEL_CHARS else value[: MAX_LABEL_CHARS - 1] + "…"


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` from /proc (None where it cannot be read: gone, another PID namespace)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # The command name in parentheses may itself hold spaces and parentheses: split after the last one.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class ProcessKey:
    run_id: str
    rank: str


def base_key(
    hello: Hello, ppid: Callable[[int], int | None] = parent_pid, node_pid: int | None = None
) -> ProcessKey:
    """``node_pid``: the process's PID on this node where it differs from the one it published (a
    container's PID namespace); fallback names use it, since containers' own PIDs (1, 7...) collide."""
    rank = hello.rank if hello.rank is not None else hello.local_rank
    run_id = label_value(hello.run_id)
    if run_id in SHARED_RUN_IDS:
        pid = node_pid or hello.pid
        launcher = ppid(pid) if hello.rank is not None or hello.local_rank is not None else None
        run_id = f"local-{launcher if launcher else pid}"
    return ProcessKey(run_id=run_id, rank=str(rank if rank is not None else 0))


def assign_keys(
    hellos: Sequence[Hello],
    ppid: Callable[[int], int | None] = parent_pid,
    node_pids: Sequence[int | None] | None = None,
) -> list[ProcessKey]:
    """One unique key per hello, in the same order. Ties on (run_id, rank) go to the process that started
    first; the others get their PID appended to the run id."""
    pids = list(node_pids) if node_pids is not None else [None] * len(hellos)
    keys = [base_key(h, ppid, p) for h, p in zip(hellos, pids, strict=True)]
    owners: dict[ProcessKey, int] = {}
    for i in sorted(range(len(hellos)), key=lambda i: (hellos[i].started_at, hellos[i].pid)):
        owners.setdefault(keys[i], i)
    out: list[ProcessKey] = []
    for i, key in enumerate(keys):
        if owners[key] != i:
            key = ProcessKey(run_id=f"{key.run_id}-pid{pids[i] or hellos[i].pid}", rank=key.rank)
        out.append(key)
    return out
