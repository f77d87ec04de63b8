"""``anatomy-top`` as a user runs it: subprocesses against the simulated box, and without a driver."""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tui import cli
from tui.report.smi_text import render_text
from tui.simnvml import Curve, Faults, Scenario, SimProcess
from tui.sources.model import MachineSnapshot, NvmlStatus
from tui.sources.nvml import LIBRARY_MISSING_REASON

GiB = 1 << 30
MiB = 1 << 20


def run_cli(
    *args: str, scenario: Path | None = None, tmp_path: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANATOMY_TOP")}
    if scenario is not None:
        env["ANATOMY_TOP_SIMULATE"] = str(scenario)
    if tmp_path is not None:
        env["ANATOMY_TOP_DIR"] = str(tmp_path / "run")  # no training sockets from elsewhere
    return subprocess.run(
        [sys.executable, "-m", "tui.cli", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def box(tmp_path: Path, spawn: Callable[[str], Any]) -> tuple[Path, Scenario, list[Any]]:
    procs = [spawn("python train.py [rank0]"), spawn("[/]"), spawn("python eval.py --rank 2")]
    time.sleep(0.1)
    scenario = Scenario.build(8, 0)
    scenario.processes = [
        SimProcess(pid=p.pid, gpu_index=k * 3, type=t, used_memory=Curve.constant((k + 1) * GiB))
        for k, (p, t) in enumerate(zip(procs, ("C", "G", "C+G"), strict=True))
    ]
    path = tmp_path / "scenario.json"
    scenario.to_json(path)
    return path, Scenario.from_json(path), procs


def test_once_text_against_the_simulated_box(box: tuple[Path, Scenario, list[Any]], tmp_path: Path) -> None:
    path, scenario, procs = box
    result = run_cli("--once", scenario=path, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    out = result.stdout
    assert f"Driver Version: {scenario.driver_version}" in out and "CUDA Version: 12.4" in out
    for gpu in scenario.gpus:
        assert gpu.bus_id in out
    assert out.count(scenario.gpus[0].name) == 8
    assert "python train.py [rank0] 300" in out and "[/] 300" in out  # markup-like text verbatim
    rows = {line.split()[4]: line.split("|")[1].split() for line in out.splitlines()
            if line.startswith("|") and any(line.split()[4:5] == [str(p.pid)] for p in procs)}  # fmt: skip
    assert rows[str(procs[0].pid)][:5] == ["0", "N/A", "N/A", str(procs[0].pid), "C"]
    assert rows[str(procs[0].pid)][-1] == "1024MiB"
    assert rows[str(procs[1].pid)][4] == "G" and rows[str(procs[2].pid)][4] == "C+G"
    assert "Host " in out


def test_once_json_against_the_simulated_box(
    box: tuple[Path, Scenario, list[Any]], tmp_path: Path, expect: ModuleType
) -> None:
    path, scenario, procs = box
    result = run_cli("--once", "--json", scenario=path, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == "anatomy-top/once" and doc["nvml"]["available"] is True
    assert doc["nvml"]["driver_version"] == scenario.driver_version
    assert 0 < doc["nvml"]["calls"] < 234  # nvitop --once's count on the same kind of box
    assert len(doc["gpus"]) == 8
    for i, gpu in enumerate(doc["gpus"]):
        want = expect.gpu_fields(scenario, i, 0.0)
        # Curves are constant in this scenario, so the subprocess's clock does not matter.
        assert gpu == want, i
    got = {p["pid"]: p for p in doc["processes"]}
    for (gpu_index, pid), fields in expect.processes(scenario, 0.0).items():
        assert got[pid]["gpu_index"] == gpu_index
        assert {k: got[pid][k] for k in fields} == fields
    assert got[procs[0].pid]["command"] == "python train.py [rank0] 300"
    assert got[procs[1].pid]["command"] == "[/] 300"
    assert all(p["alive"] for p in doc["processes"])
    assert doc["host"]["cpu_count"] == os.cpu_count() and doc["training"] == []


@pytest.mark.parametrize("as_json", [False, True])
def test_library_missing_exit_zero_with_reason(as_json: bool, tmp_path: Path) -> None:
    path = tmp_path / "nolib.json"
    Scenario.build(2, 0, faults=Faults(library_missing=True)).to_json(path)
    result = run_cli("--once", *(["--json"] if as_json else []), scenario=path, tmp_path=tmp_path)
    assert result.returncode == 0
    assert result.stderr == f"anatomy-top: no GPU shown: {LIBRARY_MISSING_REASON}\n"
    if as_json:
        doc = json.loads(result.stdout)
        assert doc["nvml"]["available"] is False and doc["nvml"]["reason"] == LIBRARY_MISSING_REASON
        assert doc["host"]["memory_total"] > 0 and doc["gpus"] == []
    else:
        assert LIBRARY_MISSING_REASON in result.stdout and "Host " in result.stdout


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver"
)
def test_real_machine_without_driver(tmp_path: Path) -> None:
    text = run_cli("--once", tmp_path=tmp_path)
    doc = run_cli("--once", "--json", tmp_path=tmp_path)
    for result in (text, doc):
        assert result.returncode == 0
        assert result.stderr.count("\n") == 1 and "NVIDIA driver not found" in result.stderr
        assert "Traceback" not in result.stderr
    assert f"Host {os.uname().nodename}" in text.stdout
    assert json.loads(doc.stdout)["host"]["hostname"] == os.uname().nodename


def test_init_failure_exit_zero(tmp_path: Path) -> None:
    path = tmp_path / "noinit.json"
    Scenario.build(1, 0, faults=Faults(init_error="DRIVER_NOT_LOADED")).to_json(path)
    result = run_cli("--once", scenario=path, tmp_path=tmp_path)
    assert result.returncode == 0
    assert result.stderr == "anatomy-top: no GPU shown: NVML initialisation failed: Driver Not Loaded\n"


def test_broken_scenario_file_is_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    result = run_cli("--once", "--json", scenario=path, tmp_path=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert json.loads(result.stdout)["nvml"]["reason"].startswith("simulated NVML (ANATOMY_TOP_SIMULATE)")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json"], "--json only goes with --once"),
        (["--interval", "0"], "must be between 0.1 and 3600"),
        (["--interval", "abc"], "not a number of seconds"),
        (["--interval", "nan"], "must be between"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_input_is_an_argparse_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("usage: anatomy-top")


def test_bad_input_subprocess_no_traceback(tmp_path: Path) -> None:
    result = run_cli("--interval", "-1", tmp_path=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr and "usage:" in result.stderr


def test_interval_parsing() -> None:
    assert cli.parse_args(["--interval", "2.5"]).interval == 2.5
    assert cli.parse_args([]).interval == cli.DEFAULT_INTERVAL == 2.0


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    import tui

    assert tui.__version__ == version("anatomy-top")  # pyproject and the package agree
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"anatomy-top {version('anatomy-top')}\n"
    assert f"anatomy-top {version('anatomy-top')}" in render_text(
        MachineSnapshot(time=0.0, nvml=NvmlStatus(True))
    )


def test_plan_passes_its_argv_through(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    leans: list[bool] = []
    fake = ModuleType("anatomy.plan_cli")

    def plan_main(argv: list[str], lean: bool = False) -> int:
        seen.append(argv)
        leans.append(lean)
        return 3

    fake.main = plan_main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "anatomy.plan_cli", fake)
    assert cli.main(["plan", "--model", "bert-base", "--once", "--json"]) == 3
    assert seen == [["--model", "bert-base", "--once", "--json"]]
    assert leans == [True]  # the command's own process may import lean (anatomy.plan.lean)


def test_monitor_gets_the_parsed_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    fake = ModuleType("tui.app")

    def run_app(args: Any, **start: Any) -> int:
        seen.append(args)
        seen.append(start)
        return 0

    fake.run_app = run_app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tui.app", fake)
    assert cli.main(["--interval", "2", "--ascii"]) == 0
    assert seen[0].interval == 2.0 and seen[0].once is False and seen[0].ascii is True
    # what the command line read before loading Textual: the first snapshot, the terminal's abilities
    start = seen[1]
    assert start["first_machine"] is not None and start["nvml"] is not None
    assert start["caps"].ascii and start["starting_pid"] is None


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the demo's training job needs torch")
def test_demo_once_json_shows_the_training_jobs_anatomy(tmp_path: Path) -> None:
    result = run_cli("--demo", "--once", "--json", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(
        f"anatomy-top: starting the demo's training job; waiting up to {cli.DEMO_WAIT_S:g} s"
    )
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    doc = json.loads(result.stdout)
    assert [g["name"] for g in doc["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 8
    assert doc["processes"] and all(p["alive"] for p in doc["processes"])
    (training,) = doc["training"]
    on_gpu0 = [p["pid"] for p in doc["processes"] if p["gpu_index"] == 0]
    assert training["pid"] in on_gpu0  # the job the simulated box places on GPU 0
    assert (
        training["state"] == "live"
        and training["snapshot"]["step"] >= 0
        and training["snapshot"]["memory"]["weights"] > 0
    )
    # it waited for a measured step with op groups: the report has them, not "not sampled yet"
    assert training["snapshot"]["op_groups"] and training["snapshot"]["op_groups_step"] is not None
    for p in doc["processes"]:  # the demo's processes are gone once it exits
        with pytest.raises(ProcessLookupError):
            os.kill(p["pid"], 0)


class _FakeDemoHandle:
    def __init__(self, log: list[str], train: bool = True) -> None:
        self.log = log
        self.train = object() if train else None
        self.train_log = Path("/nonexistent/train.log")

    train_pid = 4242

    def wait_until_publishing(self, timeout: float = 30.0, op_groups: bool = False) -> bool:
        self.log.append(f"wait {timeout:g} op_groups={op_groups}")
        return False

    def stop(self) -> None:
        self.log.append("stop")


@pytest.fixture
def fake_demo(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``tui.demo``, ``tui.app`` and the one-shot report replaced by recorders: what main() calls when."""
    log: list[str] = []
    demo = ModuleType("tui.demo")

    def start_demo(train: bool = True) -> _FakeDemoHandle:
        log.append(f"start train={train}")
        return _FakeDemoHandle(log)

    demo.start_demo = start_demo  # type: ignore[attr-defined]
    app = ModuleType("tui.app")
    app.run_app = lambda args, **start: log.append(f"monitor starting={start['starting_pid']}") or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tui.demo", demo)
    monkeypatch.setitem(sys.modules, "tui.app", app)
    monkeypatch.setattr(cli, "run_once", lambda as_json, *a: log.append(f"once json={as_json}") or 0)
    return log


def test_demo_once_waits_for_the_training_job_then_stops_it(
    fake_demo: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--demo", "--once"]) == 0
    assert fake_demo == [
        "start train=True",
        f"wait {cli.DEMO_WAIT_S:g} op_groups=True",
        "once json=False",
        "stop",
    ]
    err = capsys.readouterr().err
    assert f"waiting up to {cli.DEMO_WAIT_S:g} s for its first measured step with op groups" in err
    assert f"timed out after {cli.DEMO_WAIT_S:g} s" in err and "published no step with op groups" in err


def test_plain_demo_starts_the_monitor_without_waiting(fake_demo: list[str]) -> None:
    assert cli.main(["--demo", "--interval", "2"]) == 0
    # the monitor knows the demo's job is starting: its anatomy pane says so until it publishes
    assert fake_demo == ["start train=True", "monitor starting=4242", "stop"]


# ------------------------------------------------------------------------------------- options, help
SIMPLE_ONCE = [["--once"], ["--once", "--json"], ["--json", "--once"], ["--demo", "--once"]]


@pytest.mark.parametrize("argv", [*SIMPLE_ONCE, ["--once", "--demo", "--json"]])
def test_simple_once_flags_parse_like_argparse(argv: list[str]) -> None:
    fast = cli.parse_args(argv)
    assert not isinstance(fast, __import__("argparse").Namespace)  # the parser-free path was taken
    full = cli.build_parser().parse_args(argv)
    assert {k: getattr(fast, k) for k in vars(full)} == vars(full)


def test_help_lists_every_option_and_a_plan_example(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for action in cli.build_parser()._actions:  # argparse lists a parser's options nowhere public
        for option in action.option_strings:
            assert option in out
        assert action.help and " ".join(action.help.split()[:3]) in " ".join(out.split())
    plan_examples = [line for line in out.splitlines() if line.strip().startswith("anatomy-top plan ")]
    assert plan_examples and "--batch-size" in plan_examples[0]
    assert "--demo --once" in out


def test_once_loads_only_what_it_needs(tmp_path: Path) -> None:
    """The start-up contract of --once: none of these modules (each costs milliseconds) is imported."""
    code = (
        "import sys, io, contextlib\n"
        "from tui.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(sys.argv[1:])\n"
        "sys.stderr.write(' '.join(sorted(sys.modules)))\n"
    )
    heavy = {"textual", "rich", "argparse", "importlib.metadata", "typing", "datetime", "socket", "pathlib"}
    heavy |= {"anatomy.protocol", "anatomy.vocabulary"}  # the package itself: only anatomy.rundir
    if sys.platform.startswith("linux"):
        heavy.add("psutil")  # tui.sources.procfs instead
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANATOMY_TOP")}
    env["ANATOMY_TOP_DIR"] = str(tmp_path / "run")
    for args, also in ((["--once"], {"json"}), (["--once", "--json"], set())):
        result = subprocess.run(
            [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0
        loaded = set(result.stderr.splitlines()[-1].split())
        assert "tui.sources.nvml" in loaded  # the report did run
        assert not (heavy | also) & loaded, (heavy | also) & loaded


def test_once_includes_a_training_process_from_its_oom_file(tmp_path: Path) -> None:
    """The --once wiring of the anatomy side: a hook's last-snapshot file shows up in text and JSON."""
    from anatomy import protocol

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    pid = 4_000_000  # beyond pid_max: certainly not a live process
    hello = protocol.Hello(
        pid=pid,
        host="node-17",
        device="cuda:0",
        precision="fp32",
        optimizer="adamw",
        model_class="BertForMaskedLM [tiny]",
        parameter_count=1_000_000,
        torch_version="2.13.0",
        started_at=1.0,
    )
    snapshot = protocol.Snapshot(
        pid=pid,
        seq=3,
        time=2.0,
        step=7,
        memory={"weights": 4_000_000, "gradients": 4_000_000},
        expected_bytes_per_param={"weights": 4.0},
        parameter_count=1_000_000,
        oom="CUDA out of memory. Tried to allocate 2.00 GiB",
    )
    protocol.write_oom_file(runtime, hello, snapshot)
    doc = json.loads(run_cli("--once", "--json", tmp_path=tmp_path).stdout)
    (entry,) = doc["training"]
    assert entry["pid"] == pid and entry["state"] == "oom"
    assert entry["hello"]["model_class"] == "BertForMaskedLM [tiny]"
    assert entry["snapshot"]["memory"]["weights"] == 4_000_000
    text = run_cli("--once", tmp_path=tmp_path).stdout
    assert f"Training process {pid}" in text and "BertForMaskedLM [tiny]" in text


@pytest.mark.parametrize("where", ["explicit", "xdg", "tempdir"])
def test_publisher_precheck_covers_the_protocols_runtime_dir(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from anatomy import protocol

    for key in ("ANATOMY_TOP_DIR", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() caches its answer
    if where == "explicit":
        monkeypatch.setenv("ANATOMY_TOP_DIR", str(tmp_path / "explicit"))
    elif where == "xdg":
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    directory = protocol.runtime_dir(create=True)
    assert not cli.may_have_publishers()
    (directory / protocol.socket_name(12345)).touch()
    assert cli.may_have_publishers()
