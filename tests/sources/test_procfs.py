"""``tui.sources.procfs`` (the /proc reader of --once and of the monitor's enricher) against psutil, the
independent reference, and against hand-made /proc trees for the parsing corner cases."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tui.sources import procfs
from tui.sources.model import GpuProcess
from tui.sources.processes import ProcessEnricher

pytestmark = pytest.mark.skipif(not procfs.available(), reason="/proc is Linux-only")

LONG = "a-rather-long-program-name-for-comm"  # comm keeps 15 characters of it


@pytest.fixture
def odd_processes(
    spawn: Callable[[str], subprocess.Popen[bytes]],
    tmp_path: Path,
    wait_until_asleep: Callable[[int], None],
) -> Iterator[list[int]]:
    """Live processes with awkward names: markup, spaces and a ") " inside comm, a long program name."""
    long_program = tmp_path / LONG
    long_program.symlink_to("/bin/sleep")
    paren = tmp_path / "x) (y"  # comm "x) (y": the parser must split /proc/PID/stat at the last ")"
    paren.symlink_to("/bin/sleep")
    procs = [
        spawn("python train.py [rank0] --lr 3e-4"),
        subprocess.Popen([str(long_program), "300"], stdin=subprocess.DEVNULL),
        subprocess.Popen([str(paren), "300"], stdin=subprocess.DEVNULL),
    ]
    for p in procs:
        wait_until_asleep(p.pid)
    yield [p.pid for p in procs]
    for p in procs[1:]:
        p.kill()
        p.wait()


def test_facts_equal_psutils(odd_processes: list[int]) -> None:
    reader = procfs.ProcReader()
    for pid in odd_processes:
        got = reader.facts(pid)
        ref = psutil.Process(pid)
        assert got is not None, pid
        assert got["name"] == ref.name()
        assert got["user"] == ref.username()
        assert got["command"] == " ".join(ref.cmdline())
        assert got["host_rss"] == ref.memory_info().rss
        assert got["running_time_s"] == pytest.approx(reader.now - ref.create_time(), abs=0.05)
        assert got["cpu_percent"] is None and got["alive"] is True
    names = [reader.facts(pid)["name"] for pid in odd_processes]  # type: ignore[index]
    assert names[1] == LONG and names[2] == "x) (y"  # psutil's full name, not comm's 15 characters


def test_enrich_equals_the_monitors_enricher(odd_processes: list[int], exited_pid: int) -> None:
    nvml = [GpuProcess(gpu_index=i % 2, pid=pid, type="C") for i, pid in enumerate(odd_processes)]
    nvml += [GpuProcess(gpu_index=3, pid=odd_processes[0], type="G"), GpuProcess(0, exited_pid, "C")]
    mine = procfs.enrich(nvml)
    reference = ProcessEnricher().enrich(nvml)
    assert len(mine) == len(reference) == len(nvml)
    for a, b in zip(mine, reference, strict=True):
        assert (a.gpu_index, a.pid, a.type, a.alive) == (b.gpu_index, b.pid, b.type, b.alive)
        assert (a.name, a.user, a.command) == (b.name, b.user, b.command)
        if a.alive:  # both read /proc through procfs now: psutil stays the independent reference
            ps = psutil.Process(a.pid)
            assert (a.name, a.user, a.command) == (ps.name(), ps.username(), " ".join(ps.cmdline()))
        # RSS as psutil and ps report it (statm/VmRSS); /proc/PID/stat's rss field reads a few % low.
        assert a.host_rss == (psutil.Process(a.pid).memory_info().rss if a.alive else None)
        assert a.cpu_percent is None and b.cpu_percent is None  # a first refresh has no interval
        if b.running_time_s is None:
            assert a.running_time_s is None
        else:
            assert a.running_time_s == pytest.approx(b.running_time_s, abs=2.0)  # read moments apart
    assert mine[-1].alive is False and mine[-1].name is None and mine[-1].command is None


def test_a_zombie_counts_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        assert procfs.ProcReader().facts(child.pid) is None
    finally:
        child.wait()
    assert procfs.ProcReader().facts(child.pid) is None  # reaped: no /proc entry at all
    assert procfs.ProcReader().facts(0) is None and procfs.ProcReader().facts(-5) is None


def test_host_equals_psutils() -> None:
    host = procfs.host()
    memory, swap = psutil.virtual_memory(), psutil.swap_memory()
    assert host.cpu_percent is None  # one sample: no interval
    assert host.cpu_count == psutil.cpu_count()
    assert host.hostname == socket.gethostname()
    assert host.memory_total == memory.total and host.swap_total == swap.total
    assert host.memory_available == pytest.approx(memory.available, rel=0.05)
    assert host.memory_used == host.memory_total - host.memory_available  # type: ignore[operator]
    assert host.swap_used == pytest.approx(swap.used, abs=64 << 20)
    assert host.load_avg == pytest.approx(os.getloadavg(), abs=0.5)


# ---------------------------------------------------------------------------------------- fake /proc
def _fake_proc(
    root: Path, pid: int, *, stat: bytes, cmdline: bytes, status: bytes | None, rss_pages: int = 3
) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_bytes(stat)
    (d / "statm").write_bytes(f"900 {rss_pages} 100 5 0 50 0\n".encode())
    (d / "cmdline").write_bytes(cmdline)
    if status is not None:
        (d / "status").write_bytes(status)


def _stat(comm: bytes, state: bytes = b"S", start_ticks: int = 500) -> bytes:
    fields = [state] + [b"0"] * 18 + [str(start_ticks).encode(), b"1234", b"77"]
    return b"7 (" + comm + b") " + b" ".join(fields) + b" 0 0 0\n"


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    (tmp_path / "stat").write_bytes(b"cpu  1 2 3\nbtime 1700000000\nprocesses 9\n")
    (tmp_path / "meminfo").write_bytes(
        b"MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    600 kB\n"
        b"SwapTotal:       200 kB\nSwapFree:         50 kB\n"
    )
    (tmp_path / "self").mkdir()
    return tmp_path


def test_parsing_corner_cases(fake_root: Path) -> None:
    ticks, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    me = os.getuid()
    unknown_uid = next(u for u in range(4_242_424, 4_242_524) if not _has_user(u))
    _fake_proc(
        fake_root,
        11,
        stat=_stat(b"a) b (c", start_ticks=10 * ticks),
        rss_pages=5,
        cmdline=b"my job --flag [x]",  # argv rewritten with spaces: no NUL at all
        status=f"Name:\tx\nUid:\t{me}\t{me}\t{me}\t{me}\n".encode(),
    )
    _fake_proc(fake_root, 12, stat=_stat(b"k"), cmdline=b"", status=f"Uid:\t{unknown_uid}\t0\n".encode())
    _fake_proc(fake_root, 13, stat=_stat(b"z", state=b"Z"), cmdline=b"", status=None)
    _fake_proc(fake_root, 14, stat=_stat(b"p"), cmdline=b"p\x00-c\x00a b\x00", status=b"Name:\tp\n")
    reader = procfs.ProcReader(proc=str(fake_root), now=1_700_000_100.0)

    a = reader.facts(11)
    assert a is not None
    assert a["name"] == "a) b (c" and a["command"] == "my job --flag [x]"
    assert a["user"] == pwd.getpwuid(me).pw_name
    assert a["host_rss"] == 5 * page
    assert a["running_time_s"] == pytest.approx(100.0 - 10.0)  # booted at btime, started 10 s later
    b = reader.facts(12)
    assert b is not None and b["user"] == str(unknown_uid) and b["command"] is None
    assert reader.facts(13) is None  # zombie
    d = reader.facts(14)
    assert d is not None and d["command"] == "p -c a b" and d["user"] is None  # no Uid line: N/A
    assert reader.facts(99) is None  # no such process
    (fake_root / "15").mkdir()
    assert reader.facts(15) is None  # no stat file: the process exited while we looked

    host = procfs.host(str(fake_root))
    assert (host.memory_total, host.memory_available, host.memory_used) == (
        1000 * 1024,
        600 * 1024,
        400 * 1024,
    )
    assert (host.swap_total, host.swap_used) == (200 * 1024, 150 * 1024)


def test_meminfo_missing_is_na(tmp_path: Path) -> None:
    host = procfs.host(str(tmp_path))
    assert host.memory_total is None and host.memory_used is None and host.swap_used is None
    assert host.cpu_count == os.cpu_count()


def _has_user(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_unreadable_process_is_na_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: Any, pid: int) -> Any:
        raise RuntimeError("unexpected")

    monkeypatch.setattr(procfs.ProcReader, "facts", broken)
    (out,) = procfs.enrich([GpuProcess(0, os.getpid(), "C")])
    assert out.alive is True and out.name is None and out.command is None
