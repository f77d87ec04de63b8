"""``--only``, ``--user`` and ``--pid`` as a user types them: parsed, refused with a message, and applied
to ``--once`` against the simulated box with real processes."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tui import cli
from tui.simnvml import Curve, Scenario, SimProcess
from tui.sources.filters import ProcessFilter

GiB = 1 << 30
ME = pwd.getpwuid(os.geteuid()).pw_name


def run_cli(*args: str, scenario: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANATOMY_TOP")}
    env["ANATOMY_TOP_SIMULATE"] = str(scenario)
    env["ANATOMY_TOP_DIR"] = str(tmp_path / "run")
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def box(tmp_path: Path, spawn: Callable[[str], Any]) -> tuple[Path, list[int]]:
    procs = [spawn(f"python rank{k}.py") for k in range(4)]
    time.sleep(0.1)
    scenario = Scenario.build(4, 0)
    scenario.processes = [
        SimProcess(pid=p.pid, gpu_index=k, used_memory=Curve.constant((k + 1) * GiB))
        for k, p in enumerate(procs)
    ]
    path = tmp_path / "scenario.json"
    scenario.to_json(path)
    return path, [p.pid for p in procs]


def test_parsing() -> None:
    args = cli.parse_args(["--only", "0", "--only", "2,3", "--pid", "12", "--user"])
    assert args.process_filter == ProcessFilter(
        gpus=frozenset({0, 2, 3}), users=frozenset({ME}), pids=frozenset({12})
    )
    assert cli.parse_args(["--user", "alice,bob"]).process_filter.users == {"alice", "bob"}
    assert not cli.parse_args([]).process_filter.active
    assert cli.parse_args(["--once"]).process_filter is None  # the fast path: no filter


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "x"], "--only: 'x' is not a GPU index"),
        (["--only", "0,-1"], "--only: '-1' is not a GPU index"),
        (["--pid", "abc"], "--pid: 'abc' is not a process ID"),
    ],
)
def test_bad_filters_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.parse_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_once_json_only_the_chosen_gpus_and_processes(box: tuple[Path, list[int]], tmp_path: Path) -> None:
    path, pids = box
    result = run_cli("--once", "--json", "--only", "1,3", scenario=path, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [g["index"] for g in doc["gpus"]] == [1, 3]
    assert [p["pid"] for p in doc["processes"]] == [pids[1], pids[3]]
    result = run_cli("--once", "--json", "--pid", f"{pids[2]}", "--user", scenario=path, tmp_path=tmp_path)
    doc = json.loads(result.stdout)
    assert [p["pid"] for p in doc["processes"]] == [pids[2]] and doc["processes"][0]["user"] == ME
    assert len(doc["gpus"]) == 4  # a process filter keeps every GPU


def test_once_text_with_a_user_filter_and_an_unknown_gpu(box: tuple[Path, list[int]], tmp_path: Path) -> None:
    path, pids = box
    mine = run_cli("--once", "--user", scenario=path, tmp_path=tmp_path)
    assert all(str(pid) in mine.stdout for pid in pids)
    nobody = run_cli("--once", "--user", "nobody-at-all", scenario=path, tmp_path=tmp_path)
    assert nobody.returncode == 0 and not any(str(pid) in nobody.stdout for pid in pids)
    unknown = run_cli("--once", "--only", "2,9", scenario=path, tmp_path=tmp_path)
    assert unknown.returncode == 0
    assert "--only 9: no such GPU here" in unknown.stderr
    assert str(pids[2]) in unknown.stdout and str(pids[0]) not in unknown.stdout
