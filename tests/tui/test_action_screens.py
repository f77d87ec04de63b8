"""The process-action screens on their own (headless): the signal confirmation, the environment view,
the tree view on real processes, the metrics screen and its charts, the GPU history lines."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from screen_reader import screen_text
from textual.app import App
from textual.screen import Screen

from anatomy.vocabulary import TreeRole
from tui import format as fmt
from tui.screens.environ import EnvironScreen
from tui.screens.process_metrics import ProcessMetricsScreen, ProcessRef, chart_lines
from tui.screens.signal_dialog import SignalDialog
from tui.screens.tree import TreeScreen, TreeTable, tree_prefix
from tui.sources.environ import Environment
from tui.sources.history import MachineHistory
from tui.sources.model import GpuInfo, GpuProcess, HostInfo, MachineSnapshot, NvmlStatus
from tui.sources.signals import identify
from tui.sources.tree import TreeRow
from tui.view.gpu_history import history_lines
from tui.view.sparkline import sparkline
from tui.widgets.stylesheet import WIDGETS_TCSS

GiB = 1 << 30


class Host(App[None]):
    """An empty app to push one screen on; ``results`` collects what the screen answered."""

    CSS_PATH = WIDGETS_TCSS  # the screens show the monitor's widgets

    def __init__(self, screen: Screen[Any]) -> None:
        super().__init__()
        self.first_screen = screen
        self.results: list[Any] = []

    def on_mount(self) -> None:
        self.push_screen(self.first_screen, self.results.append)


def plain(renderable: Any, width: int = 200) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        ["sleep", "300"], stdin=subprocess.DEVNULL, env={"PATH": os.environ["PATH"], "K": "v"}
    )
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != "sleep":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


# -- signal confirmation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "answer"),
    [
        (["enter"], "terminate"),
        (["K", "enter"], "kill"),
        (["K", "T", "y"], "terminate"),
        (["I", "enter"], "interrupt"),
        (["down", "enter"], "kill"),
        (["up", "enter"], "interrupt"),
        (["escape"], None),
        (["K", "n"], None),
    ],
)
async def test_the_dialog_answers_the_chosen_signal(
    sleeper: subprocess.Popen[bytes], keys: list[str], answer: str | None
) -> None:
    app = Host(SignalDialog(identify(sleeper.pid), "terminate"))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        await pilot.press(*keys)
        await pilot.pause()
    assert app.results == [answer]
    assert sleeper.poll() is None  # the dialog itself sends nothing


async def test_the_dialog_shows_pid_user_command_and_what_each_signal_does(
    sleeper: subprocess.Popen[bytes],
) -> None:
    target = identify(sleeper.pid)
    app = Host(SignalDialog(target, "kill"))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        text = screen_text(app)
    assert f"Send a signal to PID {sleeper.pid}?" in text
    assert re.search(rf"│? *PID +{sleeper.pid} ", text) and re.search(rf"User +{target.user} ", text)
    # (btime is whole seconds, for us as for psutil: a process started a moment ago reads 0-1 s old)
    assert re.search(r"Command +sleep 300 ", text) and re.search(r"Running +[0-2]s ", text)
    assert re.search(r"▶ +K +SIGKILL +ends it at once; it cannot catch it", text)
    assert "SIGTERM" in text and "SIGINT" in text and "escape or n cancels" in text


def test_an_unknown_signal_is_refused(sleeper: subprocess.Popen[bytes]) -> None:
    with pytest.raises(ValueError, match="unknown signal"):
        SignalDialog(identify(sleeper.pid), "hangup")


# -- environment ---------------------------------------------------------------------------------


async def test_the_environment_is_listed_with_hostile_text_shown_not_obeyed() -> None:
    env = Environment(4242, (("HOME", "/home/alice"), ("EVIL\x1b[2J", "a\x07b\u202ec")))
    app = Host(EnvironScreen(env, "alice", "python train.py"))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        await pilot.press("escape")
        await pilot.pause()
    assert "Environment of PID 4242  alice  python train.py" in text
    assert "2 variables, as the process was started" in text
    assert re.search(r"HOME +/home/alice", text)
    assert "EVIL\\x1b[2J a\\x07b\\u202ec" in text and "\x1b" not in text
    assert app.results == [None]


async def test_an_unreadable_environment_says_why() -> None:
    reason = "PID 1's environment is not readable: it belongs to root, not to you (bob)"
    app = Host(EnvironScreen(Environment(1, None, reason)))
    async with app.run_test(size=(120, 20)) as pilot:
        await pilot.pause()
        text = screen_text(app)
    assert reason in text and "variables" not in text


# -- tree ----------------------------------------------------------------------------------------


def row(pid: int, depth: int, last: tuple[bool, ...]) -> TreeRow:
    return TreeRow(pid=pid, ppid=0, depth=depth, last=last, role=TreeRole.GPU)


def test_tree_prefixes() -> None:
    assert tree_prefix(row(1, 0, (True,))) == ""
    assert tree_prefix(row(2, 1, (True, False))) == "├─ "
    assert tree_prefix(row(3, 2, (True, False, True))) == "│  └─ "
    assert tree_prefix(row(4, 2, (True, True, False))) == "   ├─ "


async def test_the_tree_screen_shows_this_test_above_its_child(sleeper: subprocess.Popen[bytes]) -> None:
    procs = (GpuProcess(gpu_index=2, pid=sleeper.pid, type="C", gpu_memory=3 * GiB),)
    screen = TreeScreen(lambda: procs, interval=60.0, select_pid=sleeper.pid)
    app = Host(screen)
    async with app.run_test(size=(160, 40)) as pilot:
        deadline = time.monotonic() + 10
        while screen.builds < 1:
            assert time.monotonic() < deadline
            await pilot.pause(0.02)
        await pilot.pause()
        text = screen_text(app)
        table = screen.query_one(TreeTable)
        assert screen.selected is not None and screen.selected.pid == sleeper.pid
        keys = list(table.row_keys)
        assert keys.index(str(os.getpid())) < keys.index(str(sleeper.pid))
        await pilot.press("t")
        await pilot.pause()
    line = next(line for line in text.splitlines() if line.lstrip().startswith(f"{sleeper.pid} "))
    assert re.search(rf"{sleeper.pid} +\S+ +2 +{fmt.fmt_bytes(3 * GiB)} .*└─ sleep 300", line), line
    assert "1 on GPUs" in text
    assert app.results == [None]


# -- metrics and history -------------------------------------------------------------------------


def test_charts_and_sparklines_scale_to_their_range() -> None:
    assert sparkline([0, 50, 100, None], 4) == "▁▅█ "
    assert sparkline([10.0], 3) == "  ▁"
    assert chart_lines([100, 50, 0, None, 25], 5, 2, 0, 100) == ["█    ", "██▁ ▄"]
    assert chart_lines([75.0], 3, 1, 0, 100) == ["  ▆"]


def test_history_lines_per_gpu() -> None:
    history = MachineHistory()
    gpus = (
        GpuInfo(index=0, uuid="a", gpu_util=10, memory_used=GiB, memory_total=4 * GiB),
        GpuInfo(index=1, uuid="b", lost=True),
    )
    for k in range(3):
        snap = MachineSnapshot(time=float(k), nvml=NvmlStatus(available=True), gpus=gpus)
        history.record(snap)
    text = history_lines(gpus, history, 60).plain.splitlines()
    assert text[0].startswith("GPU 0 util ") and text[0].endswith(" 25%") and " 10%  mem " in text[0]
    assert text[1] == "GPU 1  lost"


async def test_the_metrics_screen_follows_its_process() -> None:
    history = MachineHistory()
    gpus = (GpuInfo(index=0, uuid="a", memory_total=80 * GiB),)
    state: dict[str, Any] = {}
    for k in range(4):
        proc = GpuProcess(
            gpu_index=0, pid=77, type="C", gpu_memory=(10 + k) * GiB, sm_util=20 * k, memory_bw_util=None,
            cpu_percent=50.0, host_rss=GiB, user="alice", command="python train.py", started_at=5.0,
        )  # fmt: skip
        snap = MachineSnapshot(
            time=float(k), nvml=NvmlStatus(available=True), gpus=gpus, processes=(proc,),
            host=HostInfo(memory_total=64 * GiB),
        )  # fmt: skip
        history.record(snap)
        state["snap"] = snap
    screen = ProcessMetricsScreen(ProcessRef(0, 77, 5.0), lambda: (state["snap"], history, 2.0))
    app = Host(screen)
    async with app.run_test(size=(100, 50)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        state["snap"] = MachineSnapshot(time=9.0, nvml=NvmlStatus(available=True), gpus=gpus)
        history.record(state["snap"])
        await pilot.pause(0.4)
        gone = screen_text(app)
    assert "PID 77 on GPU 0  alice" in text and "python train.py" in text
    assert "4 samples, one per refresh (2 s)" in text
    gib13 = fmt.fmt_bytes(13 * GiB)
    assert re.search(rf"GPU memory +now +{gib13} +peak +{gib13} +of {fmt.fmt_bytes(80 * GiB)}", text)
    assert re.search(r"SM utilization +now +60% +peak +60% +0–100 %", text)
    assert re.search(r"Memory bandwidth +now +N/A", text) and "N/A: not reported for this process" in text
    # The SM chart: 0, 20, 40, 60 % over six rows, newest on the right.
    assert [line.rstrip()[-4:] for line in text.splitlines() if line.rstrip().endswith("▁███")] == ["▁███"]
    assert "no longer listed" in gone and "4 samples" in gone  # its history stays


async def test_a_huge_command_line_leaves_the_choices_on_screen(sleeper: subprocess.Popen[bytes]) -> None:
    import dataclasses

    target = dataclasses.replace(identify(sleeper.pid), command="python train.py " + "--flag value " * 2000)
    app = Host(SignalDialog(target, "terminate"))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        text = screen_text(app)
    assert "more characters)" in text and "SIGKILL" in text and "escape or n cancels" in text


async def test_an_empty_tree_says_so() -> None:
    screen = TreeScreen(lambda: (), interval=60.0)
    app = Host(screen)
    async with app.run_test(size=(100, 20)) as pilot:
        deadline = time.monotonic() + 10
        while screen.builds < 1:
            assert time.monotonic() < deadline
            await pilot.pause(0.02)
        assert "no GPU process to show" in screen_text(app)
