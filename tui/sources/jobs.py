"""Multi-rank jobs: the ranks of one distributed job (torchrun's run id, or host + world size + model),
each rank's memory by component and step time, the job's total, and its slowest rank.

Stragglers are what people look for in a distributed job: every rank waits for the slowest at each
collective, so one slow rank (a throttled GPU, a noisy neighbour, an uneven shard) sets the job's pace.
The slowest live rank is always named; it is a straggler when its step time is at least
``STRAGGLER_RATIO`` times the median of the others. Stdlib only: a data-layer module, no widgets.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from anatomy.vocabulary import Component, PublisherState
from tui.sources.anatomy_source import LIVE, TrainingProcess, measured_total

STRAGGLER_RATIO = 1.1


@dataclass(frozen=True)
class RankRow:
    rank: int | None
    pid: int
    state: PublisherState
    step: int | None
    step_s: float | None
    peak: int | None  # the rank's step peak (what its components add up to)
    memory: dict[Component, int | None]  # None: not measured


@dataclass(frozen=True)
class Job:
    key: str
    run_id: str | None
    world_size: int
    model_class: str
    ranks: tuple[RankRow, ...]
    total_memory: dict[Component, int] = field(default_factory=dict)  # the sum over the ranks
    total_peak: int = 0  # sum of the ranks' peaks
    slowest_rank: int | None = None  # rank number of the slowest live rank
    straggler: bool = False  # the slowest is STRAGGLER_RATIO x slower than the others' median

    @property
    def ranks_seen(self) -> int:
        return len(self.ranks)


def jobs_of(processes: list[TrainingProcess]) -> list[Job]:
    """Every job with more than one process publishing (sorted by key); ranks sorted by rank."""
    groups: dict[str, list[TrainingProcess]] = {}
    for p in processes:
        if p.hello is None or p.rank_group is None or (p.hello.world_size or 1) <= 1:
            continue
        groups.setdefault(p.rank_group, []).append(p)
    return [_job(key, members) for key, members in sorted(groups.items()) if len(members) > 1]


def job_of(process: TrainingProcess, processes: list[TrainingProcess]) -> Job | None:
    return next((j for j in jobs_of(processes) if j.key == process.rank_group), None)


def _job(key: str, members: list[TrainingProcess]) -> Job:
    members = sorted(members, key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.pid))
    rows = tuple(_row(p) for p in members)
    total: dict[Component, int] = {}
    for row in rows:
        for component, value in row.memory.items():
            if value is not None:
                total[component] = total.get(component, 0) + value
    live = [r for r in rows if r.state == LIVE and r.step_s is not None]
    slowest = max(live, key=lambda r: r.step_s or 0.0) if live else None
    straggler = False
    if slowest is not None and len(live) > 1:
        others = [r.step_s for r in live if r is not slowest and r.step_s is not None]
        straggler = bool(others) and (slowest.step_s or 0.0) >= STRAGGLER_RATIO * statistics.median(others)
    first = members[0].hello
    assert first is not None
    return Job(
        key=key,
        run_id=first.run_id,
        world_size=first.world_size or len(members),
        model_class=first.model_class,
        ranks=rows,
        total_memory=total,
        total_peak=sum(r.peak or 0 for r in rows),
        slowest_rank=slowest.rank if slowest is not None else None,
        straggler=straggler,
    )


def _row(p: TrainingProcess) -> RankRow:
    snap = p.snapshot
    memory: dict[Component, int | None] = {}
    if snap is not None:
        memory = {c: snap.memory.get(c) for c in Component if c in snap.memory}
    return RankRow(
        rank=p.rank,
        pid=p.pid,
        state=p.state,
        step=snap.step if snap is not None else None,
        step_s=snap.timing.step_s if snap is not None else None,
        peak=measured_total(snap) if snap is not None else None,
        memory=memory,
    )
