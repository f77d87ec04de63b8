"""Run another program against a simulated box, in its own process.

    python -m tui.simnvml.run --scenario S.json [--calls-out F.json] -- nvitop --once
    python -m tui.simnvml.run --scenario S.json -- -m gpustat --json

The simulation is installed first, then the named console script or module runs in this
interpreter with ``sys.argv`` set, so its ``import pynvml`` finds the simulated library. A console
script is the wrapper script installed next to this interpreter (or on PATH), else the
``console_scripts`` entry point of that name. Exit status is the program's.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys

from tui.simnvml.curves import ScenarioError
from tui.simnvml.install import install, write_calls_at_exit
from tui.simnvml.scenario import Scenario

TYPE_CHECKING = False  # typing's names for type checkers only: the runner imports nothing it need not
if TYPE_CHECKING:
    from collections.abc import Callable

# The runner is a measuring harness: every module it imports is one the program under test finds
# already loaded. So it imports as little as it can (no argparse, no importlib.metadata, no shutil),
# and a program pays for its own start-up as it would when run directly.
USAGE = """\
usage: python -m tui.simnvml.run --scenario S.json [--calls-out F.json] -- PROGRAM [ARGS...]

Run a program against a simulated NVIDIA management library.

  --scenario S.json    scenario JSON file (see tui.simnvml.Scenario)
  --calls-out F.json   write NVML call counts (JSON) here at exit

Everything after -- is the program: a console script name and its arguments, or -m MODULE and its
arguments."""


class RunnerArgs:
    def __init__(self) -> None:
        self.scenario = ""  # required: parse_args refuses an empty one
        self.calls_out: str | None = None


def _usage_error(message: str) -> SystemExit:
    print(f"{USAGE.splitlines()[0]}\npython -m tui.simnvml.run: error: {message}", file=sys.stderr)
    return SystemExit(2)


def parse_args(argv: list[str]) -> tuple[RunnerArgs, list[str]]:
    if "--" in argv:
        cut = argv.index("--")
        own, target = argv[:cut], argv[cut + 1 :]
    else:
        own, target = argv, []
    args = RunnerArgs()
    i = 0
    while i < len(own):
        word = own[i]
        if word in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        key, eq, value = word.partition("=")
        if key not in ("--scenario", "--calls-out"):
            raise _usage_error(f"unrecognized argument: {word}")
        if not eq:
            if i + 1 >= len(own):
                raise _usage_error(f"{key} needs a value")
            i += 1
            value = own[i]
        setattr(args, key[2:].replace("-", "_"), value)
        i += 1
    if not args.scenario:
        raise _usage_error("--scenario is required")
    if not target:
        raise _usage_error("no program given after --")
    return args, target


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def main(argv: list[str] | None = None, find_script: Callable[[str], str | None] | None = None) -> int:
    """``find_script``: the wrapper script of a console script name, or None (default: ``script_file``)."""
    args, target = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        scenario = Scenario.from_json(args.scenario)
    except ScenarioError as exc:
        print(f"simnvml: {exc}", file=sys.stderr)
        return 2
    lib = install(scenario)
    if args.calls_out:
        # Registered before the program runs, so it runs after the program's own atexit
        # handlers (nvitop shuts NVML down in one) and counts their calls too.
        atexit.register(write_calls_at_exit, lib, args.calls_out)

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
    script = (find_script or script_file)(name)
    try:
        if script is not None:
            # The installed wrapper script itself, as the shell would run it (minus a new interpreter).
            runpy.run_path(script, run_name="__main__")
            return 0
        # Scanning every distribution's metadata costs ~0.1 s: only when no wrapper script is found.
        from importlib.metadata import entry_points

        found = [ep for ep in entry_points(group="console_scripts") if ep.name == name]
        if not found:
            print(f"simnvml: no console script named {name!r} is installed", file=sys.stderr)
            return 2
        result = found[0].load()()
    except SystemExit as exc:
        return _exit_code(exc)
    return result if isinstance(result, int) else 0


def script_file(name: str) -> str | None:
    """The Python wrapper script installed for console script ``name`` (next to this interpreter
    first, then on PATH), or None."""
    if os.sep in name:
        return None
    here = os.path.dirname(sys.executable)
    path_dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    for directory in [here, *path_dirs]:
        candidate = os.path.join(directory, name)
        if not os.path.isfile(candidate) or not os.access(candidate, os.X_OK):
            continue
        try:
            with open(candidate, "rb") as f:
                first_line = f.readline(256)
        except OSError:
            continue
        if first_line.startswith(b"#!") and b"python" in first_line:
            return candidate
    return None


if __name__ == "__main__":
    sys.exit(main())
