"""``anatomy-top --replay RUN``: a recorded run in the monitor's anatomy pane, at any recorded step.

← → move one recorded snapshot, PgUp/PgDn a tenth of the run, Home/End to the start and the end, Tab to
the next rank of a job, q quits. The pane's sparklines show the whole run (the record's step rows, each
value an equal range of steps: :func:`whole_run`), the table, timing, op groups and suggestions the
snapshot at the chosen step; the OOM snapshot of a run that died of it comes last.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Static

from anatomy.protocol import Hello, Snapshot
from anatomy.runs import Run, RunGroup
from tui.format import fmt_bytes
from tui.sources.anatomy_source import EXITED, LIVE, OOM, TrainingProcess, rank_group_key
from tui.step_buckets import MAX, MEAN, even_series
from tui.view.anatomy import anatomy_view
from tui.widgets.anatomy_pane import AnatomyPane
from tui.widgets.stylesheet import WIDGETS_TCSS

POINTS = 600  # per sparkline series: more than the pane has cells


@dataclass(frozen=True)
class Frame:
    """One recorded moment of one rank: the hello in effect and the snapshot."""

    hello: Hello
    snapshot: Snapshot
    oom: bool = False


def frames(run: Run) -> list[Frame]:
    """The run's snapshots in order (the OOM's last), each with the hello in effect at its step."""
    if not run.hellos:
        return []
    out = []
    changes = [(step if step is not None else -1, hello) for _, step, hello in run.hellos]
    snaps = [(s, False) for s in run.snapshots] + [(s, True) for s in run.ooms]
    for snap, oom in snaps:
        hello = changes[0][1]
        for step, h in changes:
            if step < snap.step:
                hello = h
        out.append(Frame(hello, snap, oom))
    return out


def whole_run(run: Run, points: int = POINTS) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Every step's peak and time over the whole run, in at most ``points`` values per series, each
    standing for an equal range of steps (:func:`tui.step_buckets.even_series`): the largest peak of
    its steps (a spike must show), their mean time. Rows thinned by the recorder count for the steps
    they stand for, so the dense recent past takes no more of a sparkline than its share of the run."""
    rows = run.rows
    xs = [r.step for r in rows]
    firsts = [r.step - r.n + 1 for r in rows]
    peaks = even_series(xs, [r.peak_bytes for r in rows], points, MAX, firsts)
    times = even_series(xs, [r.step_s for r in rows], points, MEAN, firsts)
    return tuple(int(p) for p in peaks), tuple(times)


def process_at(run: Run, frame: Frame, history: tuple[tuple[int, ...], tuple[float, ...]]) -> TrainingProcess:
    return TrainingProcess(
        pid=run.pid,
        hello=frame.hello,
        snapshot=frame.snapshot,
        # "live" for a job's ranks, so the ranks table names the slowest; the title says it is a replay.
        state=OOM if frame.oom else (LIVE if (run.world_size or 1) > 1 else EXITED),
        memory_history=history[0],
        step_time_history=history[1],
        rank_group=rank_group_key(frame.hello),
        oom=frame.snapshot.oom if frame.oom else None,
        path=run.path,
    )


class ReplayApp(App[int]):
    # The widgets' stylesheet first: app.tcss, read after it, wins a tie as it did over their DEFAULT_CSS.
    CSS_PATH: ClassVar[list[str | PurePath]] = [WIDGETS_TCSS, "app.tcss"]
    TITLE = "anatomy-top replay"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "move(-1)", "previous"),
        Binding("right", "move(1)", "next"),
        Binding("pageup", "jump(-1)", "-10%"),
        Binding("pagedown", "jump(1)", "+10%"),
        Binding("home", "edge(0)", "start"),
        Binding("end", "edge(1)", "end"),
        Binding("tab,r", "rank", "next rank", priority=True),
        Binding("q", "quit", "quit"),
    ]

    def __init__(self, group: RunGroup) -> None:
        super().__init__()
        self.group = group
        self.frames = [frames(run) for run in group.runs]
        self.histories = [whole_run(run) for run in group.runs]
        self.rank = 0
        self.index = max(len(self.frames[0]) - 1, 0)

    def compose(self) -> ComposeResult:
        yield Static(id="replay-status")
        yield AnatomyPane(id="anatomy")
        yield Static(
            Text("← → step   PgUp/PgDn ±10%   Home/End   Tab rank   q quit", style="bright_black"),
            id="replay-keys",
        )

    def on_mount(self) -> None:
        self.show()
        self.query_one(AnatomyPane).focus()

    @property
    def current(self) -> Sequence[Frame]:
        return self.frames[self.rank]

    def show(self) -> None:
        frames_ = self.current
        pane = self.query_one(AnatomyPane)
        status = self.query_one("#replay-status", Static)
        run = self.group.runs[self.rank]
        if not frames_:
            status.update(Text(f"replay {self.group.id}: no snapshot recorded", style="bold"))
            pane.show(None)
            return
        self.index = min(max(self.index, 0), len(frames_) - 1)
        frame = frames_[self.index]
        process = process_at(run, frame, self.histories[self.rank])
        group = [process]
        for i, other in enumerate(self.group.runs):  # the job's other ranks at the nearest step
            if i != self.rank and self.frames[i]:
                near = min(self.frames[i], key=lambda f: abs(f.snapshot.step - frame.snapshot.step))
                group.append(process_at(other, near, self.histories[i]))
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(frame.snapshot.time))
        view = anatomy_view(process, group, None, plain=pane.plain)
        pane.show(view, hint=f"recorded at {when}; the sparklines span the whole run")
        text = Text(f"replay {self.group.id}", style="bold")
        if len(self.group.runs) > 1:
            text.append(f"  rank {run.rank} ({self.rank + 1} of {len(self.group.runs)})")
        text.append(f"  step {frame.snapshot.step:,}", style="bold cyan")
        text.append(f"  · snapshot {self.index + 1} of {len(frames_)}")
        peak = run.peak_bytes
        text.append(f"  · run: {run.steps:,} steps, peak {fmt_bytes(peak)}, {self.group.ended}")
        status.update(text)

    def action_move(self, delta: int) -> None:
        self.index += delta
        self.show()

    def action_jump(self, direction: int) -> None:
        self.index += direction * max(len(self.current) // 10, 1)
        self.show()

    def action_edge(self, end: int) -> None:
        self.index = len(self.current) - 1 if end else 0
        self.show()

    def action_rank(self) -> None:
        step = self.current[self.index].snapshot.step if self.current else 0
        self.rank = (self.rank + 1) % len(self.group.runs)
        if self.current:
            self.index = min(
                range(len(self.current)), key=lambda i: abs(self.current[i].snapshot.step - step)
            )
        self.show()


def run_replay(spec: str) -> int:
    import sys

    from anatomy import runs
    from tui.startup import PROG

    try:
        group = runs.resolve(spec)
    except (LookupError, OSError, ValueError) as exc:
        print(f"{PROG} --replay: {exc}", file=sys.stderr)
        return 1
    return int(ReplayApp(group).run() or 0)
