"""The process list's merge, filter and sort rules (pure functions, no Textual)."""

from __future__ import annotations

import frozen

from tui.view.process_rows import ProcessRow, build_rows, filter_rows, row_key, sort_rows
from tui.widgets.stylesheet import WIDGETS_TCSS


def test_rows_merge_nvml_processes_with_publishers_nvml_does_not_list() -> None:
    machine = frozen.machine()
    training = frozen.training()
    rows = build_rows(machine, training, frozen.frozen_host_lookup([frozen.OOM_PID]))
    assert len(rows) == len(machine.processes) + 1
    by_key = {r.key: r for r in rows}
    train = by_key[row_key(0, frozen.TRAIN_PID)]
    assert train.training_state == "live" and train.gpu_memory == frozen.NVML_TRAIN_BYTES
    oom = by_key[row_key(None, frozen.OOM_PID)]
    assert oom.training_state == "oom" and oom.gpu_index is None and oom.gpu_memory is None
    assert by_key[row_key(1, 3001)].training_state is None  # does not publish
    ranks = [by_key[row_key(4 + r, pid)].rank for r, pid in enumerate(frozen.DDP_PIDS)]
    assert ranks == [0, 1, 2, 3]


def test_publisher_without_host_figures_still_gets_a_row() -> None:
    cpu_job = frozen.cpu_training()
    rows = build_rows(frozen.no_gpu_machine(), [cpu_job], None)
    assert [(r.pid, r.command) for r in rows] == [(frozen.CPU_TRAIN_PID, cpu_job.hello.model_class)]


def test_sort_puts_missing_values_last_in_both_directions() -> None:
    rows = build_rows(frozen.machine(), frozen.training(), frozen.frozen_host_lookup([frozen.OOM_PID]))
    down = sort_rows(rows, "gpu_memory")
    up = sort_rows(rows, "gpu_memory", reverse=True)
    assert down[-1].gpu_memory is None and up[-1].gpu_memory is None
    present = [r.gpu_memory for r in down if r.gpu_memory is not None]
    assert present == sorted(present, reverse=True)
    assert [r.gpu_memory for r in up if r.gpu_memory is not None] == sorted(present)
    by_user = [r.user for r in sort_rows(rows, "user")]
    assert by_user == sorted(by_user, key=lambda u: (u or "").casefold())


def test_filter_is_case_insensitive_over_command_user_and_pid() -> None:
    rows = build_rows(frozen.machine(), [], None)
    assert {r.pid for r in filter_rows(rows, "SERVE")} == {3001}
    assert {r.pid for r in filter_rows(rows, "frank")} == set(frozen.DDP_PIDS)
    assert {r.pid for r in filter_rows(rows, "300")} == {3001, 3002, 3003, 3004}
    assert {r.pid for r in filter_rows(rows, "[/]")} == {3003, 3004}  # brackets are plain text
    assert filter_rows(rows, "") == rows


async def test_process_table_repaints_a_row_only_when_what_it_shows_changes() -> None:
    from dataclasses import replace

    from textual.app import App, ComposeResult

    from tui import format as fmt
    from tui.view.poll import row_cells
    from tui.widgets.process_table import ProcessTable

    class Host(App[None]):
        CSS_PATH = WIDGETS_TCSS

        def compose(self) -> ComposeResult:
            yield ProcessTable(id="p")

    rows = build_rows(frozen.machine(), [], None)
    values, cells = row_cells(rows)
    app = Host()
    async with app.run_test(size=(160, 40)) as pilot:
        table = app.query_one(ProcessTable)
        table.show(rows, cells)
        await pilot.pause()

        def aged(row: ProcessRow, seconds: float) -> ProcessRow:
            t = row.running_time_s
            return replace(row, running_time_s=None if t is None else t + seconds)

        # Later: every row's running time moved; a row's cells are new exactly when its shown time is.
        for seconds in (10.0, 70.0, 3600.0):
            before = {k: table.get_row(k) for k in table.row_keys}
            shown_before = {r.key: fmt.fmt_elapsed(r.running_time_s) for r in rows}
            rows = [aged(r, seconds) for r in rows]
            values, cells = row_cells(rows, values, cells)
            table.show(rows, cells)
            for row in rows:
                shown = fmt.fmt_elapsed(row.running_time_s)
                assert table.get_cell(row.key, "time").plain == shown
                assert (table.get_row(row.key) is before[row.key]) == (shown == shown_before[row.key])
        assert any(r.running_time_s is not None and r.running_time_s > 86400 for r in rows)
