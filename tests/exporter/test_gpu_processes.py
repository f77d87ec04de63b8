"""Per-process series for every GPU process, publishing or not: NVML's memory, SM and bandwidth shares per
GPU, the host's resident memory, labelled by PID and a cleaned, capped command; gone when the process
is; at most ``--max-processes`` of them, the largest first."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tui import simnvml
from tui.exporter.collector import NodeCollector
from tui.exporter.families import HOST_PROCESS_LABELS, PROCESS_LABELS
from tui.exporter.gpu_processes import COMMAND_CHARS, NodeProcesses, command_label
from tui.simnvml.processes import spawn_sleepers, stop_sleepers
from tui.sources.model import GpuProcess
from tui.sources.procfs import read_resident_pages

MEMORY = "anatomy_process_gpu_memory_used_bytes"
SM = "anatomy_process_gpu_sm_utilization_ratio"
BANDWIDTH = "anatomy_process_gpu_memory_bandwidth_utilization_ratio"
RSS = "anatomy_process_host_memory_rss_bytes"
GIB = 1 << 30


@pytest.fixture
def sleepers() -> Iterator[Callable[..., list[Any]]]:
    started: list[Any] = []

    def start(names: list[str]) -> list[Any]:
        procs = spawn_sleepers(len(names), names)
        started.extend(procs)
        return procs

    yield start
    stop_sleepers(started)


def _box(pids_memory: dict[int, tuple[int, int]], gpus: int = 2) -> simnvml.Scenario:
    """``pid -> (gpu, bytes)``; busy processes (SM 40 %, bandwidth 20 %) on a box that samples them."""
    return simnvml.Scenario(
        gpus=[simnvml.SimGpu() for _ in range(gpus)],
        processes=[
            simnvml.SimProcess(
                pid=pid,
                gpu_index=gpu,
                used_memory=simnvml.Curve(base=float(used)),
                sm_util=simnvml.Curve(base=40.0),
                memory_util=simnvml.Curve(base=20.0),
            )
            for pid, (gpu, used) in pids_memory.items()
        ],
    )


def test_every_gpu_process_has_its_series_and_loses_them_when_it_ends(
    sim: Callable[..., Any],
    scrape: Callable[..., Any],
    sleepers: Callable[..., list[Any]],
    one: Callable[..., float],
    pick: Callable[..., Any],
) -> None:
    procs = sleepers(["python train.py --lr 3e-4", "python eval.py", "python serve.py --port 80"])
    pids = [p.pid for p in procs]
    scenario = _box({pids[0]: (0, 30 * GIB), pids[1]: (1, 2 * GIB), pids[2]: (1, 5 * GIB)})
    lib = sim(scenario)
    collector = NodeCollector()
    series = scrape(collector)
    page = os.sysconf("SC_PAGE_SIZE")
    commands = {
        pids[0]: "python train.py --lr 3e-4",
        pids[1]: "python eval.py",
        pids[2]: "python serve.py --port 80",
    }
    gpus = {pids[0]: "0", pids[1]: "1", pids[2]: "1"}
    uuids = {str(i): g.uuid for i, g in enumerate(scenario.gpus)}
    for pid, command in commands.items():
        labels = {"pid": str(pid), "command": command, "gpu": gpus[pid]}
        (lab,) = pick(series, MEMORY, **labels)
        assert set(dict(lab)) == set(PROCESS_LABELS) and dict(lab)["UUID"] == uuids[gpus[pid]]
        assert one(series, MEMORY, **labels) == {0: 30, 1: 2, 2: 5}[pids.index(pid)] * GIB
        assert one(series, SM, **labels) == 0.4 and one(series, BANDWIDTH, **labels) == 0.2
        (host,) = pick(series, RSS, pid=str(pid))
        assert set(dict(host)) == set(HOST_PROCESS_LABELS) and dict(host)["command"] == command
        resident = read_resident_pages(pid)
        assert resident is not None and one(series, RSS, pid=str(pid)) == resident * page  # an idle bash
    assert one(series, "anatomy_exporter_processes_dropped") == 0

    # The eval process ends: NVML stops listing it, and its series leave the next scrape.
    procs[1].terminate()
    procs[1].wait()
    lib.scenario.processes = [p for p in lib.scenario.processes if p.pid != pids[1]]
    series = scrape(collector)
    for name in (MEMORY, SM, BANDWIDTH, RSS):
        assert not pick(series, name, pid=str(pids[1])), name
        assert len(pick(series, name)) == 2, name
    assert one(series, "anatomy_gpu_processes", gpu="1") == 1


def test_the_cap_keeps_the_largest_processes_and_counts_the_rest(
    sim: Callable[..., Any],
    scrape: Callable[..., Any],
    sleepers: Callable[..., list[Any]],
    one: Callable[..., float],
    pick: Callable[..., Any],
) -> None:
    pids = [p.pid for p in sleepers([f"python worker.py {i}" for i in range(6)])]
    sim(_box({pid: (i % 2, (i + 1) * GIB) for i, pid in enumerate(pids)}))
    series = scrape(NodeCollector(max_processes=2))
    kept = {dict(lab)["pid"] for lab in pick(series, MEMORY)}
    assert kept == {str(pids[5]), str(pids[4])}  # 6 GiB and 5 GiB
    assert {dict(lab)["pid"] for lab in pick(series, RSS)} == kept
    assert one(series, "anatomy_exporter_processes_dropped") == 4
    series = scrape(NodeCollector(max_processes=0))
    assert not pick(series, MEMORY) and one(series, "anatomy_exporter_processes_dropped") == 6


def test_a_hostile_command_line_becomes_a_clean_short_label(
    sim: Callable[..., Any],
    scrape: Callable[..., Any],
    sleepers: Callable[..., list[Any]],
    pick: Callable[..., Any],
) -> None:
    (proc,) = sleepers(["python bad.py \x1b[2J\x07ring --name=" + "x" * 300])
    sim(_box({proc.pid: (0, GIB)}, gpus=1))
    series = scrape(NodeCollector())
    (lab,) = pick(series, MEMORY, pid=str(proc.pid))
    command = dict(lab)["command"]
    assert command.startswith("python bad.py \\x1b[2J\\x07ring --name=xxx")
    assert len(command) == COMMAND_CHARS and command.endswith("…")
    assert command.isprintable()


@pytest.mark.parametrize(
    ("argv", "comm", "label"),
    [
        (["/usr/bin/python3", "train.py", "--lr", "3e-4"], None, "python3 train.py --lr 3e-4"),
        (["python", "a\tb\nc", "  d  "], None, "python a\\tb\\nc d"),  # escaped, whitespace collapsed
        (["x" * 100], None, "x" * (COMMAND_CHARS - 1) + "…"),
        ([], "kworker/0:1", "kworker/0:1"),  # no argv: the kernel's name
        (None, None, ""),
        (["\u202eevil"], None, "\\u202eevil"),  # a bidi override shown, not obeyed
    ],
)
def test_command_label(argv: list[str] | None, comm: str | None, label: str) -> None:
    assert command_label(argv, comm) == label


def test_a_command_is_read_once_while_its_process_is_listed() -> None:
    reads: list[int] = []

    def read_command(pid: int, _proc: str) -> str:
        reads.append(pid)
        return f"cmd {pid}"

    table = NodeProcesses(proc="/proc", read_command=read_command)
    a, b = GpuProcess(gpu_index=0, pid=11, type="C", gpu_memory=1), GpuProcess(gpu_index=1, pid=22, type="C")
    for _ in range(3):
        out, dropped = table.read([a, b])
        assert [(p.pid, p.command) for p in out] == [(11, "cmd 11"), (22, "cmd 22")] and dropped == 0
    assert reads == [11, 22]
    table.read([a])  # 22 left NVML's list: forgotten, so a new process with its PID is read afresh
    table.read([a, b])
    assert reads == [11, 22, 22]


def test_mig_instances_of_one_gpu_make_one_series(
    sim: Callable[..., Any],
    scrape: Callable[..., Any],
    sleepers: Callable[..., list[Any]],
    one: Callable[..., float],
) -> None:
    """Entries of one process on two MIG instances of a GPU add up (one series per GPU, never two)."""
    (proc,) = sleepers(["python mig.py"])
    from tui.simnvml.presets import preset

    scenario = preset("mig")
    mig = scenario.gpus[0].mig_devices
    assert len(mig) >= 2
    scenario.processes = [
        simnvml.SimProcess(
            pid=proc.pid,
            gpu_index=0,
            used_memory=simnvml.Curve(base=float(n * GIB)),
            gpu_instance_id=m.gpu_instance_id,
            compute_instance_id=m.compute_instance_id,
        )
        for n, m in ((1, mig[0]), (2, mig[1]))
    ]
    sim(scenario)
    series = scrape(NodeCollector())
    assert one(series, MEMORY, pid=str(proc.pid), gpu="0") == 3 * GIB
