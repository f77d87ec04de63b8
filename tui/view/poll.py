"""One poll as the monitor shows it (``PollView``), built in the poll worker: the process list's rows and
each publishing process's anatomy, computed before the UI thread sees the sample."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from rich.text import Text

from tui.sources.model import GpuProcess, MachineSnapshot, SourceError
from tui.sources.reconcile import nvml_process_bytes
from tui.sources.training import TrainingProcess
from tui.view.anatomy import AnatomyView, anatomy_view
from tui.view.gpus import GpuView, gpu_views
from tui.view.header import HeaderView, header_view
from tui.view.process_cells import cells_of, shown_values
from tui.view.process_rows import ProcessRow, build_rows

Cells = tuple[Text, ...]  # one process row's cells: every column, in process_cells.COLUMNS order


@dataclass(frozen=True)
class PollView:
    """What one poll shows. ``training``: the publishing processes; ``rows``: the process list before
    the user's filters (NVML's processes and the publishers it does not list); ``anatomy``: each
    publishing PID's anatomy pane; ``errors``: what the sources could not read."""

    machine: MachineSnapshot | None = None
    training: tuple[TrainingProcess, ...] = ()
    host_figures: Mapping[int, GpuProcess] = field(default_factory=dict)
    rows: tuple[ProcessRow, ...] = ()
    # Row key -> its cells; a row that shows the same values as in the previous poll keeps the very same
    # cells (the table then skips it). ``values``: what each row's cells show, to tell.
    cells: Mapping[str, Cells] = field(default_factory=dict)
    values: Mapping[str, tuple[object, ...]] = field(default_factory=dict)
    anatomy: Mapping[int, AnatomyView] = field(default_factory=dict)
    errors: tuple[SourceError, ...] = ()
    header: HeaderView | None = None  # the machine's header lines (None: no sample yet)
    gpus: tuple[GpuView, ...] = ()  # every GPU's table cells in words, by index

    def without(self, pid: int) -> PollView:
        """This view with the publisher ``pid`` gone (dismissed), until the next poll says more."""
        training = tuple(t for t in self.training if t.pid != pid)
        rows = tuple(build_rows(self.machine, training, self.host_figures))
        values, cells = row_cells(rows, self.values, self.cells)
        return replace(
            self,
            training=training,
            rows=rows,
            cells=cells,
            values=values,
            anatomy={p: v for p, v in self.anatomy.items() if p != pid},
        )


def row_cells(
    rows: Sequence[ProcessRow],
    previous_values: Mapping[str, tuple[object, ...]] | None = None,
    previous_cells: Mapping[str, Cells] | None = None,
) -> tuple[dict[str, tuple[object, ...]], dict[str, Cells]]:
    """Each row's shown values and cells by row key; the previous cells reused (the very same tuple)
    where a row shows the same values as before."""
    values: dict[str, tuple[object, ...]] = {}
    cells: dict[str, Cells] = {}
    old_values, old_cells = previous_values or {}, previous_cells or {}
    for row in rows:
        shown = values[row.key] = shown_values(row)
        earlier = old_cells.get(row.key)
        same = earlier is not None and old_values.get(row.key) == shown
        cells[row.key] = earlier if earlier is not None and same else cells_of(shown)
    return values, cells


def nvml_bytes_for(machine: MachineSnapshot | None, pid: int) -> int | None:
    """What NVML reports for ``pid`` on the GPU it trains on, or None where it reports nothing."""
    if machine is None:
        return None
    return nvml_process_bytes(pid, machine.processes)


def job_group(process: TrainingProcess, training: Sequence[TrainingProcess]) -> list[TrainingProcess]:
    """The processes of ``process``'s job (itself included); none when it belongs to no job."""
    if process.rank_group is None:
        return []
    return [t for t in training if t.rank_group == process.rank_group]


def poll_view(
    machine: MachineSnapshot | None,
    training: Sequence[TrainingProcess],
    host_figures: Mapping[int, GpuProcess] | None = None,
    errors: Sequence[SourceError] = (),
    *,
    plain: bool = False,
    previous: PollView | None = None,
) -> PollView:
    """The view of one poll. ``plain``: no colour (the component rows carry their bar letter);
    ``previous``: the last poll's view, whose anatomy views are reused where nothing they show changed."""
    figures = dict(host_figures or {})
    shown = tuple(training)
    earlier = previous.anatomy if previous is not None else {}
    anatomy = {
        p.pid: anatomy_view(
            p, job_group(p, shown), nvml_bytes_for(machine, p.pid), plain, previous=earlier.get(p.pid)
        )
        for p in shown
    }
    rows = tuple(build_rows(machine, shown, figures))
    if previous is not None:
        values, cells = row_cells(rows, previous.values, previous.cells)
    else:
        values, cells = row_cells(rows)
    return PollView(
        machine=machine,
        training=shown,
        host_figures=figures,
        rows=rows,
        cells=cells,
        values=values,
        anatomy=anatomy,
        errors=tuple(errors),
        header=header_view(machine),
        gpus=gpu_views(machine.gpus) if machine is not None else (),
    )
