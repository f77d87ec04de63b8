"""Which GPUs and processes the monitor shows: ``--only GPU[,GPU]``, ``--user USER[,USER]``,
``--pid PID[,PID]`` and the keys that set the same filters.

The filter works on anything with ``gpu_index``, ``user`` and ``pid`` (NVML's processes, the process
table's rows), so one rule decides everywhere. A process with no GPU (a training job on the CPU) is
hidden by a GPU filter: it is on none of the chosen GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

from tui.sources.model import GpuInfo, MachineSnapshot


class FilterError(ValueError):
    """A filter argument that cannot be understood; the message is for the user."""


class _Filterable(Protocol):
    @property
    def gpu_index(self) -> int | None: ...
    @property
    def user(self) -> str | None: ...
    @property
    def pid(self) -> int: ...


T = TypeVar("T", bound=_Filterable)


def _items(values: Iterable[str] | str | None) -> list[str]:
    """``["0,1", "3"]`` / ``"0, 1"`` → ``["0", "1", "3"]``: commas and repeats both work."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


def parse_gpus(values: Iterable[str] | str | None) -> frozenset[int] | None:
    """GPU indices as ``nvidia-smi -i`` takes them; None when nothing was given."""
    items = _items(values)
    if not items:
        return None
    out = set()
    for item in items:
        if not item.isdigit():
            raise FilterError(f"--only: {item!r} is not a GPU index (0, 1, …; several: 0,2)")
        out.add(int(item))
    return frozenset(out)


def parse_pids(values: Iterable[str] | str | None) -> frozenset[int] | None:
    items = _items(values)
    if not items:
        return None
    out = set()
    for item in items:
        if not item.isdigit() or int(item) <= 0:
            raise FilterError(f"--pid: {item!r} is not a process ID")
        out.add(int(item))
    return frozenset(out)


def parse_users(values: Sequence[str] | str | None) -> frozenset[str] | None:
    """User names; ``--user`` with no name means the user running the monitor (as in nvitop)."""
    if values is None:
        return None
    items = _items(values)
    return frozenset(items) if items else frozenset({current_user()})


def current_user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


@dataclass(frozen=True)
class ProcessFilter:
    """None = no filter on that field. Immutable: the keys make new filters."""

    gpus: frozenset[int] | None = None
    users: frozenset[str] | None = None
    pids: frozenset[int] | None = None

    @property
    def active(self) -> bool:
        return self.gpus is not None or self.users is not None or self.pids is not None

    def keeps_gpu(self, index: int) -> bool:
        return self.gpus is None or index in self.gpus

    def keeps(self, item: _Filterable) -> bool:
        if self.gpus is not None and (item.gpu_index is None or item.gpu_index not in self.gpus):
            return False
        if self.users is not None and item.user not in self.users:
            return False
        return self.pids is None or item.pid in self.pids

    def rows(self, items: Iterable[T]) -> list[T]:
        return [item for item in items if self.keeps(item)]

    def gpus_of(self, gpus: Iterable[GpuInfo]) -> tuple[GpuInfo, ...]:
        return tuple(g for g in gpus if self.keeps_gpu(g.index))

    def apply(self, snapshot: MachineSnapshot) -> MachineSnapshot:
        """The snapshot with only the chosen GPUs and processes."""
        if not self.active:
            return snapshot
        return replace(
            snapshot, gpus=self.gpus_of(snapshot.gpus), processes=tuple(self.rows(snapshot.processes))
        )

    def unknown_gpus(self, gpus: Iterable[GpuInfo]) -> list[int]:
        """Chosen indices the machine does not have (a typo, or a GPU that fell off the bus)."""
        present = {g.index for g in gpus}
        return sorted(i for i in self.gpus or () if i not in present)

    def describe(self) -> str:
        """ "GPU 0,2 · user alice · PID 4242" (empty without a filter)."""
        parts = []
        if self.gpus is not None:
            parts.append("GPU " + ",".join(str(i) for i in sorted(self.gpus)))
        if self.users is not None:
            parts.append("user " + ",".join(sorted(self.users)))
        if self.pids is not None:
            parts.append("PID " + ",".join(str(p) for p in sorted(self.pids)))
        return " · ".join(parts)

    # The keys: each toggles one filter to the selected process's value, or off again.
    def toggled_gpu(self, index: int | None) -> ProcessFilter:
        if self.gpus is not None or index is None:
            return replace(self, gpus=None)
        return replace(self, gpus=frozenset({index}))

    def toggled_user(self, user: str | None) -> ProcessFilter:
        if self.users is not None or user is None:
            return replace(self, users=None)
        return replace(self, users=frozenset({user}))

    def toggled_pid(self, pid: int | None) -> ProcessFilter:
        if self.pids is not None or pid is None:
            return replace(self, pids=None)
        return replace(self, pids=frozenset({pid}))


def from_args(
    only: Sequence[str] | None, user: Sequence[str] | None, pid: Sequence[str] | None
) -> ProcessFilter:
    """The command line's filters (FilterError with a message for the user)."""
    return ProcessFilter(gpus=parse_gpus(only), users=parse_users(user), pids=parse_pids(pid))


__all__ = [
    "FilterError",
    "ProcessFilter",
    "current_user",
    "from_args",
    "parse_gpus",
    "parse_pids",
    "parse_users",
]
