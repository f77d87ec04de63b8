"""Run another program against a simulated box, in its own process.

    python -m tui.simnvml.run --scenario S.json [--calls-out F.json] -- nvitop --once
    python -m tui.simnvml.run --scenario S.json -- -m gpustat --json

The simulation is installed first, then the named console script or module runs in this
interpreter with ``sys.argv`` set, so its ``import pynvml`` finds the simulated library. A console
script is the wrapper script installed next to this interpreter (or on PATH), else the
``console_scripts`` entry point of that name. Exit status is the program's.
"""

from __future__ import annotations

import argparse
import atexit
import os
import runpy
import shutil
import sys
from importlib.metadata import entry_points
from pathlib import Path

from tui.simnvml.curves import ScenarioError
from tui.simnvml.install import _write_calls_at_exit, install
from tui.simnvml.scenario import Scenario


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        own, target = argv[:cut], argv[cut + 1 :]
    else:
        own, target = argv, []
    parser = argparse.ArgumentParser(
        prog="python -m tui.simnvml.run",
        description="Run a program against a simulated NVIDIA management library.",
        epilog="Everything after -- is the program: a console script name and its arguments, "
        "or -m MODULE and its arguments.",
    )
    parser.add_argument("--scenario", required=True, help="scenario JSON file (see tui.simnvml.Scenario)")
    parser.add_argument("--calls-out", help="write NVML call counts (JSON) here at exit")
    args = parser.parse_args(own)
    if not target:
        parser.error("no program given after --")
    return args, target


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    args, target = _parse(sys.argv[1:] if argv is None else argv)
    try:
        scenario = Scenario.from_json(args.scenario)
    except ScenarioError as exc:
        print(f"simnvml: {exc}", file=sys.stderr)
        return 2
    lib = install(scenario)
    if args.calls_out:
        # Registered before the program runs, so it runs after the program's own atexit
        # handlers (nvitop shuts NVML down in one) and counts their calls too.
        atexit.register(_write_calls_at_exit, lib, args.calls_out)

    if target[0] == "-m":
        if len(target) < 2:
            print("simnvml: -m needs a module name", file=sys.stderr)
            return 2
        sys.argv = [target[1], *target[2:]]
        try:
            runpy.run_module(target[1], run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            return _exit_code(exc)
        return 0

    name = target[0]
    sys.argv = [name, *target[1:]]
    script = _script_file(name)
    try:
        if script is not None:
            # The installed wrapper script itself, as the shell would run it (minus a new interpreter).
            runpy.run_path(str(script), run_name="__main__")
            return 0
        # Scanning every distribution's metadata costs ~0.1 s: only when no wrapper script is found.
        found = [ep for ep in entry_points(group="console_scripts") if ep.name == name]
        if not found:
            print(f"simnvml: no console script named {name!r} is installed", file=sys.stderr)
            return 2
        result = found[0].load()()
    except SystemExit as exc:
        return _exit_code(exc)
    return result if isinstance(result, int) else 0


def _script_file(name: str) -> Path | None:
    """The Python wrapper script installed for console script ``name`` (next to this interpreter
    first, then on PATH), or None."""
    if os.sep in name:
        return None
    for candidate in (Path(sys.executable).parent / name, shutil.which(name)):
        if candidate is None or not Path(candidate).is_file():
            continue
        try:
            with open(candidate, "rb") as f:
                first_line = f.readline(256)
        except OSError:
            continue
        if first_line.startswith(b"#!") and b"python" in first_line:
            return Path(candidate)
    return None


if __name__ == "__main__":
    sys.exit(main())
