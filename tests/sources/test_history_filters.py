"""The data layer's history (per GPU, per process; bounded; a recycled PID starts afresh) and the
process filters (``--only``, ``--user``, ``--pid`` and their keys)."""

from __future__ import annotations

import pwd
from typing import Any

import pytest

from tui.simnvml import Curve, Scenario, SimProcess
from tui.sources.filters import FilterError, ProcessFilter, from_args, parse_gpus, parse_pids, parse_users
from tui.sources.history import FORGET_AFTER, MachineHistory, memory_percent
from tui.sources.machine import MachineSource
from tui.sources.model import GpuInfo, GpuProcess, MachineSnapshot, NvmlStatus
from tui.sources.nvml import NvmlSource

GiB = 1 << 30


def snap(t: float, gpus: tuple[GpuInfo, ...], procs: tuple[GpuProcess, ...] = ()) -> MachineSnapshot:
    return MachineSnapshot(time=t, nvml=NvmlStatus(available=True), gpus=gpus, processes=procs)


def gpu(index: int, util: int | None, used: int | None, uuid: str | None = None) -> GpuInfo:
    return GpuInfo(
        index=index, uuid=uuid or f"GPU-{index}", gpu_util=util, memory_used=used, memory_total=80 * GiB
    )


# -- history -------------------------------------------------------------------------------------


def test_gpu_series_follow_the_snapshots_and_stay_bounded() -> None:
    history = MachineHistory(length=5)
    for k in range(8):
        history.record(snap(float(k), (gpu(0, 10 * k, k * GiB), gpu(1, None, None))))
    series = history.gpu(gpu(0, None, None))
    assert series is not None
    assert series["gpu_util"].last() == [30, 40, 50, 60, 70]
    assert list(series["gpu_util"].times) == [3.0, 4.0, 5.0, 6.0, 7.0]
    assert series["memory_percent"].last(2) == [pytest.approx(100 * 6 / 80), pytest.approx(100 * 7 / 80)]
    assert series["gpu_util"].peak() == 70 and series["gpu_util"].latest() == 70
    na = history.gpu(gpu(1, None, None))
    assert na is not None and na["gpu_util"].last() == [None] * 5 and na["gpu_util"].peak() is None
    assert history.recorded == 8


def test_a_gpu_is_followed_by_uuid_and_a_lost_one_records_na() -> None:
    history = MachineHistory()
    history.record(snap(0.0, (gpu(0, 50, GiB, uuid="GPU-a"),)))
    history.record(snap(1.0, (GpuInfo(index=0, uuid="GPU-a", gpu_util=99, lost=True),)))
    history.record(snap(2.0, (gpu(0, 7, GiB, uuid="GPU-b"),)))  # another board at index 0
    a = history.gpu(GpuInfo(index=5, uuid="GPU-a"))
    b = history.gpu(GpuInfo(index=0, uuid="GPU-b"))
    assert a is not None and a["gpu_util"].last() == [50, None]
    assert b is not None and b["gpu_util"].last() == [7]


def test_process_series_and_a_recycled_pid_starts_afresh() -> None:
    history = MachineHistory()
    first = GpuProcess(gpu_index=0, pid=42, type="C", gpu_memory=GiB, sm_util=80, started_at=100.0)
    history.record(snap(0.0, (), (first,)))
    history.record(
        snap(
            1.0,
            (),
            (GpuProcess(gpu_index=0, pid=42, type="C", gpu_memory=2 * GiB, sm_util=None, started_at=100.0),),
        )
    )
    reborn = GpuProcess(gpu_index=0, pid=42, type="C", gpu_memory=5, sm_util=1, started_at=200.0)
    history.record(snap(2.0, (), (reborn,)))
    old = history.process(first)
    new = history.process(reborn)
    assert (
        old is not None and old["gpu_memory"].last() == [GiB, 2 * GiB] and old["sm_util"].last() == [80, None]
    )
    assert new is not None and new["gpu_memory"].last() == [5]


def test_processes_gone_for_a_while_are_forgotten() -> None:
    history = MachineHistory()
    proc = GpuProcess(gpu_index=0, pid=7, type="C", gpu_memory=1)
    history.record(snap(0.0, (), (proc,)))
    for k in range(FORGET_AFTER - 1):
        history.record(snap(1.0 + k, ()))
    assert history.process(proc) is not None
    history.record(snap(100.0, ()))
    assert history.process(proc) is None
    with pytest.raises(ValueError):
        MachineHistory(length=0)


def test_history_of_a_simulated_box_matches_nvml(sim: Any, clock: Any) -> None:
    scenario = Scenario.build(2, 0)
    scenario.gpus[1].gpu_util = Curve(keyframes=((0.0, 0.0), (10.0, 100.0)))
    scenario.processes = [SimProcess(pid=999_999, gpu_index=1, used_memory=Curve.constant(GiB))]
    sim(scenario)
    history = MachineHistory()
    with MachineSource(nvml=NvmlSource(clock=clock)) as machine:
        for t in (0.0, 2.5, 5.0):
            clock.now = t
            history.record(machine.snapshot())
        last = machine.snapshot()
    series = history.gpu(last.gpus[1])
    assert series is not None and series["gpu_util"].last() == [0, 25, 50]
    assert series["memory_percent"].latest() == pytest.approx(memory_percent(last.gpus[1]))
    proc = history.process(last.processes[0])
    assert proc is not None and proc["gpu_memory"].last() == [GiB] * 3


# -- filters -------------------------------------------------------------------------------------


def row(gpu_index: int | None, user: str | None, pid: int) -> GpuProcess:
    return GpuProcess(gpu_index=gpu_index, user=user, pid=pid, type="C")  # type: ignore[arg-type]


ROWS = [row(0, "alice", 10), row(1, "bob", 11), row(2, "alice", 12), row(None, "alice", 13), row(1, None, 14)]


def test_parsing_the_command_line() -> None:
    assert parse_gpus(["0,2", "5"]) == {0, 2, 5} and parse_gpus(None) is None and parse_gpus([]) is None
    assert parse_pids("12, 13") == {12, 13}
    assert parse_users(["alice,bob"]) == {"alice", "bob"}
    me = pwd.getpwuid(__import__("os").geteuid()).pw_name
    assert parse_users([]) == {me}  # --user alone: mine
    assert parse_users(None) is None
    for bad, call in (("x", parse_gpus), ("-1", parse_gpus), ("1.5", parse_pids), ("0", parse_pids)):
        with pytest.raises(FilterError, match=repr(bad)):
            call([bad])
    assert from_args(["1"], None, ["11"]) == ProcessFilter(gpus=frozenset({1}), pids=frozenset({11}))


def test_each_filter_and_their_combination() -> None:
    assert ProcessFilter().rows(ROWS) == ROWS and not ProcessFilter().active
    assert [r.pid for r in ProcessFilter(gpus=frozenset({0, 1})).rows(ROWS)] == [10, 11, 14]  # no CPU row
    assert [r.pid for r in ProcessFilter(users=frozenset({"alice"})).rows(ROWS)] == [10, 12, 13]
    assert [r.pid for r in ProcessFilter(pids=frozenset({13, 99})).rows(ROWS)] == [13]
    both = ProcessFilter(gpus=frozenset({0, 2}), users=frozenset({"alice"}), pids=frozenset({12}))
    assert [r.pid for r in both.rows(ROWS)] == [12]
    assert both.describe() == "GPU 0,2 · user alice · PID 12" and ProcessFilter().describe() == ""


def test_keys_toggle_to_the_selection_and_back() -> None:
    f = ProcessFilter().toggled_gpu(1)
    assert f.gpus == {1}
    assert f.toggled_gpu(2).gpus is None  # a second press clears
    assert ProcessFilter().toggled_gpu(None).gpus is None  # nothing selected: nothing to filter on
    assert ProcessFilter().toggled_user("bob").users == {"bob"}
    assert ProcessFilter(users=frozenset({"bob"})).toggled_user("eve").users is None
    assert (
        ProcessFilter().toggled_pid(5).pids == {5}
        and ProcessFilter(pids=frozenset({5})).toggled_pid(5).pids is None
    )


def test_applied_to_a_snapshot_and_unknown_gpus_named() -> None:
    gpus = (gpu(0, 1, 1), gpu(1, 2, 2), gpu(2, 3, 3))
    procs = tuple(GpuProcess(gpu_index=i % 3, pid=100 + i, type="C", user="u") for i in range(6))
    f = ProcessFilter(gpus=frozenset({1, 7}))
    out = f.apply(snap(0.0, gpus, procs))
    assert [g.index for g in out.gpus] == [1] and [p.pid for p in out.processes] == [101, 104]
    assert f.unknown_gpus(gpus) == [7]
    assert ProcessFilter().apply(snap(0.0, gpus, procs)).processes == procs
