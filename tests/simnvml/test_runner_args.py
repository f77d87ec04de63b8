"""``python -m tui.simnvml.run``'s own command line (parsed by hand: the runner preloads nothing)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tui.simnvml import Scenario
from tui.simnvml.run import parse_args

ROOT = Path(__file__).resolve().parents[2]


def test_parse_forms() -> None:
    args, target = parse_args(["--scenario", "a.json", "--calls-out=c.json", "--", "nvitop", "--once"])
    assert (args.scenario, args.calls_out, target) == ("a.json", "c.json", ["nvitop", "--once"])
    args, target = parse_args(["--scenario=b.json", "--", "-m", "pynvml", "--", "x"])
    assert (args.scenario, args.calls_out, target) == ("b.json", None, ["-m", "pynvml", "--", "x"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--", "nvitop"], "--scenario is required"),
        (["--scenario", "a.json"], "no program given after --"),
        (["--scenario"], "--scenario needs a value"),
        (["--scenario", "a.json", "--bogus", "--", "x"], "unrecognized argument: --bogus"),
    ],
)
def test_bad_arguments_exit_2_with_usage(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m tui.simnvml.run") and message in err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--help"])
    assert exc.value.code == 0 and "--calls-out" in capsys.readouterr().out


def test_the_runner_preloads_no_argparse_nor_metadata(tmp_path: Path) -> None:
    """What the runner imports, every program under it finds already loaded (and gets for free)."""
    path = tmp_path / "box.json"
    Scenario.build(1).to_json(path)
    code = (
        "import sys, tui.simnvml.run as r\n"
        "rc = r.main(['--scenario', sys.argv[1], '--', '-m', 'pynvml'])\n"
        "print(rc, ' '.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    rc, _, modules = result.stdout.strip().splitlines()[-1].partition(" ")
    loaded = set(modules.split())
    assert rc == "0" and "pynvml" in loaded and "tui.simnvml.install" in loaded
    assert not {"argparse", "importlib.metadata"} & loaded  # (pynvml itself loads shutil, subprocess)
