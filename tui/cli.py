"""The ``anatomy-top`` command line.

    anatomy-top                     the live monitor (Textual)
    anatomy-top --once [--json]     one nvidia-smi-style report (or one JSON document) and exit
    anatomy-top --demo              either of the above against a simulated 8-GPU box
    anatomy-top plan ...            pre-flight memory plan (anatomy.plan_cli)

Imports stay lazy: ``--once`` must not pay for Textual, and ``plan`` alone needs torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

PROG = "anatomy-top"
DEFAULT_INTERVAL = 1.0
MIN_INTERVAL = 0.1
MAX_INTERVAL = 3600.0
ONCE_WAIT_S = 1.0  # how long --once waits for each training process's first snapshot


def _version() -> str:
    from tui.report.smi_text import tool_version

    return tool_version()


def interval_seconds(text: str) -> float:
    """argparse type for --interval: a finite number of seconds within [MIN_INTERVAL, MAX_INTERVAL]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise argparse.ArgumentTypeError(
            f"must be between {MIN_INTERVAL:g} and {MAX_INTERVAL:g} seconds, got {text!r}"
        )
    return value


class _VersionAction(argparse.Action):
    # The version is looked up only when asked for (importlib.metadata is not free).
    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"{PROG} {_version()}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Watch where GPU memory and time go during deep-learning training: nvidia-smi's view "
            "next to the training step's anatomy."
        ),
        epilog=(
            "subcommands:\n  plan ...     pre-flight memory plan for a model "
            f"(see '{PROG} plan --help'; needs the 'train' extra)"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--once", action="store_true", help="print one report and exit")
    parser.add_argument("--json", action="store_true", help="with --once: one JSON document instead of text")
    parser.add_argument(
        "--demo", action="store_true", help="run against a simulated 8-GPU box with a small training job"
    )
    parser.add_argument(
        "--interval",
        type=interval_seconds,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"refresh interval of the monitor (default {DEFAULT_INTERVAL:g})",
    )
    parser.add_argument("--version", action=_VersionAction)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.json and not args.once:
        parser.error("--json only goes with --once")
    return args


# ------------------------------------------------------------------------------------------ demo
def _demo_env(train: bool = True) -> Callable[[], None]:
    """Point this process at the simulated 8-GPU box; return the function that tears it down.

    ``train``: also start the demo's small CPU training job (pointless for ``--once``: it would not
    publish its first step before the report is printed).
    """
    try:
        from tui.demo import start_demo
    except ImportError:
        return _minimal_demo_env()
    handle = start_demo(train=train)
    return handle.stop


def _minimal_demo_env() -> Callable[[], None]:
    """The demo without its training job: sleeper processes on a simulated box (fallback)."""
    import atexit
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    from tui.simnvml import Scenario

    directory = Path(tempfile.mkdtemp(prefix="anatomy-top-demo-"))
    sleepers: list[subprocess.Popen[bytes]] = []
    for rank in range(8):
        command = f"python train.py --config llama-7b.yaml --rank {rank}"
        sleepers.append(
            subprocess.Popen(
                ["bash", "-c", f'exec -a "{command}" sleep 100000'],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    scenario_path = directory / "scenario.json"
    Scenario.demo_box(n_gpus=8, pids=[p.pid for p in sleepers]).to_json(scenario_path)
    saved = os.environ.get("ANATOMY_TOP_SIMULATE")
    os.environ["ANATOMY_TOP_SIMULATE"] = str(scenario_path)

    def stop() -> None:
        for proc in sleepers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if saved is None:
            os.environ.pop("ANATOMY_TOP_SIMULATE", None)
        else:
            os.environ["ANATOMY_TOP_SIMULATE"] = saved
        shutil.rmtree(directory, ignore_errors=True)

    atexit.register(stop)
    return stop


# ------------------------------------------------------------------------------------------ once
def _may_have_publishers() -> bool:
    """A cheap pre-check before loading the anatomy side (~15 ms of imports) for --once.

    Looks for any ``anatomy-*`` entry in every directory ``anatomy.protocol.runtime_dir`` could pick
    (a superset: a false "maybe" only costs the imports; a false "no" would hide a training process).
    """
    explicit = os.environ.get("ANATOMY_TOP_DIR")
    if explicit:
        candidates = [explicit]
    else:
        candidates = []
        if os.environ.get("XDG_RUNTIME_DIR"):
            candidates.append(os.path.join(os.environ["XDG_RUNTIME_DIR"], "anatomy-top"))
        temps = [os.environ.get(k) for k in ("TMPDIR", "TEMP", "TMP")] + ["/tmp", "/var/tmp", "/usr/tmp"]
        candidates += [os.path.join(t, f"anatomy-top-{os.getuid()}") for t in temps if t]
    for directory in candidates:
        try:
            with os.scandir(directory) as entries:
                if any(e.name.startswith("anatomy-") for e in entries):
                    return True
        except OSError:
            continue
    return False


def _training(machine: Any, as_json: bool) -> Any:
    """Each publishing training process's anatomy for --once (empty when none publishes)."""
    if not _may_have_publishers():
        return None
    try:
        from tui.sources.anatomy_source import poll_once

        processes = poll_once(wait_s=ONCE_WAIT_S)
        if not processes:
            return None
        if as_json:
            from tui.report.anatomy_json import training_json

            return training_json(processes, machine)
        from tui.report.anatomy_text import render_training_text

        return render_training_text(processes, machine)
    except Exception as exc:  # the GPU report stands on its own
        print(f"{PROG}: training processes not shown: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def run_once(as_json: bool) -> int:
    from tui.sources.machine import MachineSource

    source = MachineSource()
    try:
        machine = source.snapshot()
        calls = source.last_nvml_calls
    finally:
        source.close()
    training = _training(machine, as_json)
    if not machine.nvml.available:
        print(f"{PROG}: no GPU shown: {machine.nvml.reason}", file=sys.stderr)
    if as_json:
        from tui.report.once_json import render_json

        out = json.dumps(render_json(machine, training, nvml_calls=calls), indent=2) + "\n"
    else:
        from tui.report.smi_text import render_text

        out = render_text(machine, training)
    try:
        sys.stdout.write(out)
        sys.stdout.flush()
    except BrokenPipeError:  # `anatomy-top --once | head`
        _silence_stdout()
    return 0


def _silence_stdout() -> None:
    # Python would report the broken pipe again while flushing at exit.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


# ------------------------------------------------------------------------------------------ main
def run_plan(argv: Sequence[str]) -> int:
    try:
        from anatomy.plan_cli import main as plan_main
    except ImportError as exc:
        print(
            f"{PROG} plan is not available: {exc} "
            "(install the 'train' extra: pip install 'anatomy-top[train]')",
            file=sys.stderr,
        )
        return 1
    return int(plan_main(list(argv)) or 0)


def run_monitor(args: argparse.Namespace) -> int:
    try:
        from tui.app import run_app
    except ImportError as exc:
        print(f"{PROG}: the monitor cannot start: {exc}", file=sys.stderr)
        return 1
    return int(run_app(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plan":
        return run_plan(argv[1:])
    args = parse_args(argv)  # bad input: argparse prints usage and exits 2
    stop: Callable[[], None] | None = None
    try:
        if args.demo:
            stop = _demo_env(train=not args.once)
        if args.once:
            return run_once(args.json)
        return run_monitor(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # no traceback for users
        print(f"{PROG}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        if stop is not None:
            stop()


if __name__ == "__main__":
    sys.exit(main())
