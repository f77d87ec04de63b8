"""Host snapshot and the enrichment of GPU processes (/proc through ``tui.sources.procfs``, psutil as the
fallback), against real local processes with psutil as the reference."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from tui.simnvml import Curve, Scenario, SimProcess
from tui.sources import procfs
from tui.sources.host import HostSource
from tui.sources.machine import MachineSource
from tui.sources.model import GpuProcess
from tui.sources.nvml import NvmlSource
from tui.sources.processes import ProcessEnricher
from tui.sources.procfs import parse_proc_stat, read_proc_stat

GiB = 1 << 30


def test_host_snapshot_matches_psutil() -> None:
    source = HostSource()
    first = source.snapshot()
    assert first.cpu_percent is None  # no interval yet: N/A, not psutil's meaningless 0.0
    assert first.hostname == socket.gethostname()
    assert first.cpu_count == psutil.cpu_count()
    vm = psutil.virtual_memory()
    assert first.memory_total == vm.total
    assert first.memory_used is not None and first.memory_available is not None
    assert first.memory_used + first.memory_available == first.memory_total
    assert abs(first.memory_available - vm.available) < 256 * (1 << 20)
    assert first.swap_total == psutil.swap_memory().total
    load = os.getloadavg()
    assert first.load_avg is not None and all(
        abs(a - b) < 2.0 for a, b in zip(first.load_avg, load, strict=True)
    )
    time.sleep(0.05)
    second = source.snapshot()
    assert second.cpu_percent is not None and 0.0 <= second.cpu_percent <= 100.0


def test_enrichment_of_a_real_process(spawn: Callable[[str], Any]) -> None:
    proc = spawn("python train.py [rank0]")
    time.sleep(0.1)  # let exec happen
    enricher = ProcessEnricher()
    gpu = GpuProcess(gpu_index=0, pid=proc.pid, type="C", gpu_memory=GiB)
    (first,) = enricher.enrich([gpu])
    ps = psutil.Process(proc.pid)
    assert first.alive
    assert first.command == " ".join(ps.cmdline()) and first.command.startswith("python train.py [rank0]")
    assert first.user == ps.username()
    assert first.name == ps.name()
    assert first.host_rss is not None and abs(first.host_rss - ps.memory_info().rss) < 4 << 20
    assert first.running_time_s is not None
    assert abs(first.running_time_s - (time.time() - ps.create_time())) < 1.0
    assert first.cpu_percent is None  # first sample has no interval
    assert (first.gpu_index, first.pid, first.type, first.gpu_memory) == (0, proc.pid, "C", GiB)
    (second,) = enricher.enrich([gpu])
    assert second.cpu_percent is not None and second.cpu_percent >= 0.0  # cached Process: has an interval


def test_exited_pid_is_not_alive(exited_pid: int) -> None:
    (p,) = ProcessEnricher().enrich([GpuProcess(gpu_index=3, pid=exited_pid, type="C", gpu_memory=5)])
    assert p.alive is False
    assert (p.name, p.user, p.command, p.cpu_percent, p.host_rss, p.running_time_s) == (None,) * 6
    assert (p.gpu_index, p.pid, p.gpu_memory) == (3, exited_pid, 5)


def test_process_exits_between_nvml_list_and_psutil_lookup(
    sim: Any, clock: Any, spawn: Callable[[str], Any]
) -> None:
    alive, doomed = spawn("python serve.py"), spawn("python train.py --rank 1")
    time.sleep(0.1)
    scenario = Scenario.build(1, 0)
    scenario.processes = [
        SimProcess(pid=alive.pid, gpu_index=0, used_memory=Curve.constant(GiB)),
        SimProcess(pid=doomed.pid, gpu_index=0, used_memory=Curve.constant(2 * GiB)),
    ]
    sim(scenario)
    with NvmlSource(clock=clock) as source:
        listed = source.query().processes  # NVML still lists both
    assert {p.pid for p in listed} == {alive.pid, doomed.pid}
    doomed.kill()
    doomed.wait()
    enriched = {p.pid: p for p in ProcessEnricher().enrich(listed)}
    assert enriched[alive.pid].alive and enriched[alive.pid].command == "python serve.py 300"
    gone = enriched[doomed.pid]
    assert gone.alive is False and gone.command is None and gone.gpu_memory == 2 * GiB


@pytest.mark.parametrize("path", ["procfs", "psutil"])
def test_access_denied_gives_what_is_readable(
    monkeypatch: pytest.MonkeyPatch, spawn: Callable[[str], Any], path: str
) -> None:
    proc = spawn("python other_users_job.py")
    time.sleep(0.1)

    def denied(self: psutil.Process, *args: Any, **kwargs: Any) -> Any:
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "cmdline", denied)
    monkeypatch.setattr(psutil.Process, "username", denied)
    read_file = procfs.read_file

    def denied_file(name: str) -> bytes | None:
        if path == "psutil" and name.endswith("/stat"):  # hidepid-like: the psutil fallback answers
            raise PermissionError(name)
        if name.endswith(("/cmdline", "/status")):
            raise PermissionError(name)
        return read_file(name)

    monkeypatch.setattr(procfs, "read_file", denied_file)
    enricher = ProcessEnricher()
    (p,) = enricher.enrich([GpuProcess(gpu_index=0, pid=proc.pid, type="C")])
    assert enricher.path_of(proc.pid) == path
    assert p.alive and p.command is None and p.user is None
    assert p.name == "sleep" and p.host_rss is not None and p.host_rss > 0 and p.running_time_s is not None


def test_pid_on_several_gpus_and_cache_pruning(spawn: Callable[[str], Any]) -> None:
    proc = spawn("torchrun worker")
    time.sleep(0.1)
    enricher = ProcessEnricher()
    rows = enricher.enrich([GpuProcess(gpu_index=i, pid=proc.pid, type="C") for i in range(3)])
    assert [r.gpu_index for r in rows] == [0, 1, 2] and len({r.command for r in rows}) == 1
    assert enricher.known_pids == {proc.pid}
    enricher.enrich([])
    assert enricher.known_pids == frozenset()  # processes gone from NVML's list are forgotten


def test_machine_snapshot_enriches_simulated_processes(
    sim: Any, clock: Any, spawn: Callable[[str], Any]
) -> None:
    procs = [spawn(f"python train.py --rank {k} [/]") for k in range(3)]
    time.sleep(0.1)
    sim(Scenario.build(2, 3, pids=[p.pid for p in procs]))
    with MachineSource(nvml=NvmlSource(clock=clock)) as machine:
        snap = machine.snapshot()
    got = {p.pid: p for p in snap.processes}
    for k, proc in enumerate(procs):
        assert got[proc.pid].command == f"python train.py --rank {k} [/] 300"
        assert got[proc.pid].gpu_index == k % 2


def test_proc_stat_parser_takes_fields_after_the_last_parenthesis() -> None:
    # A name with spaces and parentheses: fields are counted from the last ")" (proc(5)).
    fields = ["S", "1", "2", "3", "0", "-1", "4194560", "10", "0", "0", "0"]
    fields += ["1234", "567", "0", "0", "20", "0", "4", "0", "987654", "123456789", "4321"]
    fields += ["0"] * 30
    data = f"4242 (my (odd) name) {' '.join(fields)}\n".encode()
    stat = parse_proc_stat(data)
    assert stat.comm == "my (odd) name" and stat.state == "S"
    assert stat.cpu_ticks == 1234 + 567  # utime + stime, fields 14 and 15
    assert stat.start_ticks == 987654  # field 22
    assert stat.rss_pages == 4321  # field 24


def test_proc_stat_of_this_process_agrees_with_psutil() -> None:
    stat = read_proc_stat(os.getpid())
    assert stat is not None
    me = psutil.Process()
    ticks = os.sysconf("SC_CLK_TCK")
    assert abs(stat.rss_pages * os.sysconf("SC_PAGE_SIZE") - me.memory_info().rss) < 8 << 20
    assert abs(psutil.boot_time() + stat.start_ticks / ticks - me.create_time()) < 0.05
    times = me.cpu_times()
    assert abs(stat.cpu_ticks / ticks - (times.user + times.system)) < 0.1


def test_static_facts_are_read_once_per_process(
    monkeypatch: pytest.MonkeyPatch, spawn: Callable[[str], Any]
) -> None:
    proc = spawn("python train.py --cached")
    time.sleep(0.1)
    reads: list[int] = []
    cmdline = procfs.ProcReader.cmdline

    def counting(self: procfs.ProcReader, pid: int) -> list[str] | None:
        reads.append(pid)
        return cmdline(self, pid)

    monkeypatch.setattr(procfs.ProcReader, "cmdline", counting)
    enricher = ProcessEnricher()
    gpu = [GpuProcess(gpu_index=0, pid=proc.pid, type="C")]
    results = [enricher.enrich(gpu)[0] for _ in range(4)]
    assert reads == [proc.pid]  # cached after the first refresh
    assert all(r.command == "python train.py --cached 300" for r in results)
    assert results[-1].host_rss == psutil.Process(proc.pid).memory_info().rss


def test_exec_is_noticed_and_the_command_read_again(spawn: Callable[[str], Any]) -> None:
    # bash first (the name "bash"), then exec: a new name under the same PID and start time.
    proc = subprocess.Popen(
        ["bash", "-c", 'sleep 0.4; exec -a "python train.py --after-exec" sleep 300'],
        stdin=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.1)
        enricher = ProcessEnricher()
        gpu = [GpuProcess(gpu_index=0, pid=proc.pid, type="C")]
        (before,) = enricher.enrich(gpu)
        assert before.name == "bash" and before.command is not None and before.command.startswith("bash")
        time.sleep(0.6)
        (after,) = enricher.enrich(gpu)
        assert after.name == "sleep" and after.command == "python train.py --after-exec 300"
    finally:
        proc.kill()
        proc.wait()


def test_a_recycled_pid_is_a_new_process(
    monkeypatch: pytest.MonkeyPatch, spawn: Callable[[str], Any]
) -> None:
    proc = spawn("python first_owner.py")
    time.sleep(0.1)
    enricher = ProcessEnricher()
    gpu = [GpuProcess(gpu_index=0, pid=proc.pid, type="C")]
    enricher.enrich(gpu)
    (second,) = enricher.enrich(gpu)
    assert second.cpu_percent is not None
    real = read_proc_stat(proc.pid)
    assert real is not None
    # Same PID, a later start time: another process. Its CPU % has no interval yet.
    recycled = dataclasses.replace(real, start_ticks=real.start_ticks + 100)
    monkeypatch.setattr(procfs.ProcReader, "stat", lambda self, pid: recycled)
    (third,) = enricher.enrich(gpu)
    assert third.cpu_percent is None and third.alive
    expected = time.time() - (psutil.boot_time() + recycled.start_ticks / os.sysconf("SC_CLK_TCK"))
    assert third.running_time_s is not None and abs(third.running_time_s - max(0.0, expected)) < 1.0


def test_cpu_percent_matches_psutil_over_the_same_interval() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
    try:
        time.sleep(0.1)
        enricher = ProcessEnricher()
        gpu = [GpuProcess(gpu_index=0, pid=busy.pid, type="C")]
        reference = psutil.Process(busy.pid)
        enricher.enrich(gpu)
        reference.cpu_percent(None)
        time.sleep(0.5)
        (ours,) = enricher.enrich(gpu)
        theirs = reference.cpu_percent(None)
        assert ours.cpu_percent is not None and ours.cpu_percent > 5.0
        assert abs(ours.cpu_percent - theirs) < 15.0  # 10 ms ticks over 0.5 s, and the calls' skew
    finally:
        busy.kill()
        busy.wait()


def test_a_zombie_is_not_alive() -> None:
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while (stat := read_proc_stat(child.pid)) is not None and stat.state != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        (p,) = ProcessEnricher().enrich([GpuProcess(gpu_index=0, pid=child.pid, type="C")])
        assert p.alive is False and p.command is None
    finally:
        child.wait()


def test_unreadable_proc_stat_falls_back_to_psutil(
    monkeypatch: pytest.MonkeyPatch, spawn: Callable[[str], Any]
) -> None:
    proc = spawn("python hidden_by_hidepid.py")
    time.sleep(0.1)

    def denied(self: procfs.ProcReader, pid: int) -> None:
        raise PermissionError(pid)

    monkeypatch.setattr(procfs.ProcReader, "stat", denied)
    enricher = ProcessEnricher()
    gpu = [GpuProcess(gpu_index=0, pid=proc.pid, type="C")]
    (first,) = enricher.enrich(gpu)
    (second,) = enricher.enrich(gpu)
    ps = psutil.Process(proc.pid)
    assert first.command == "python hidden_by_hidepid.py 300" and first.cpu_percent is None
    assert second.cpu_percent is not None and second.host_rss == ps.memory_info().rss
    assert enricher.path_of(proc.pid) == "psutil"
