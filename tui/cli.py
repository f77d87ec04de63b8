"""The ``anatomy-top`` command line.

    anatomy-top                     the live monitor (Textual)
    anatomy-top --once [--json]     one nvidia-smi-style report (or one JSON document) and exit
    anatomy-top --demo              either of the above against a simulated 8-GPU box
    anatomy-top plan ...            pre-flight memory plan (anatomy.plan_cli)
    anatomy-top exporter ...        the node's Prometheus endpoint (tui.exporter.server)

Start-up matters for ``--once`` (people run it in loops and scripts): nothing is imported before it is
needed. ``--once`` loads no Textual, no rich, no argparse for the common flags, no json for text, no
psutil on Linux (``tui.sources.procfs``), and the anatomy side only when a training process may be
publishing. The monitor reads NVML and draws its first frame (``tui.first_frame``) before it loads
Textual.

The simulated NVIDIA library (``ANATOMY_TOP_SIMULATE=<scenario.json>``, and ``--demo``) is installed here,
once, at start-up (``install_simulation``); the data layer reads whatever NVML pynvml then finds.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from tui import __version__
from tui.intervals import DEFAULT_INTERVAL, MAX_INTERVAL, MIN_INTERVAL, describe_interval

# Start-up pieces the exporter sub-command shares live in tui.startup (no cli <-> exporter import circle).
from tui.startup import DEMO_WAIT_S, PROG, install_simulation, start_demo

# typing is not imported at run time (~3 ms of --once start-up); the names are for type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from tui.sources.model import MachineSnapshot

ONCE_WAIT_S = 1.0  # how long --once waits for each training process's first snapshot
# What the text report never prints: not asked of NVML by `--once` without --json.
TEXT_OMITS = ("uuid", "nvml_version", "process_utilization")
# Flags --once may come with that need no parser (anything else goes through argparse).
_SIMPLE_FLAGS = frozenset({"--once", "--json", "--demo", "--ascii"})

DESCRIPTION = """\
Watch where GPU memory and time go during deep-learning training: nvidia-smi's view
(GPUs, processes, host) next to each training step's anatomy (weights, optimizer states,
gradients, activations, temporaries; contractions, normalizations, element-wise ops),
measured by the in-process hook (anatomy.track / anatomy.AnatomyCallback)."""

EXAMPLES = f"""\
subcommands:
  plan MODEL [options]  pre-flight memory plan of a transformers model before training:
                        weights, optimizer states, gradients, activations, the largest batch
                        that fits (needs the 'train' extra; see '{PROG} plan --help')
  exporter [options]    a Prometheus endpoint for this node's GPUs and training processes
                        (needs the 'exporter' extra; see '{PROG} exporter --help')
  runs [--json]         the runs the flight recorder kept, newest first
  report RUN [-o F.html] [--png F.png]
                        a recorded run (an id, a record file, or 'last') as one offline HTML page

examples:
  {PROG}                        live monitor, refreshed {describe_interval(DEFAULT_INTERVAL)}
  {PROG} --interval 0.5         live monitor, twice a second
  {PROG} --ascii                no box drawing or symbols the terminal cannot show
  {PROG} --only 0,1 --user      GPUs 0 and 1, my processes only (also --pid 4242)
  NO_COLOR=1 {PROG}             no colour escape at all (also TERM=dumb)
  {PROG} --once                 one nvidia-smi-style text report, then exit
  {PROG} --once --json          one JSON document for scripts (e.g. | jq .gpus)
  {PROG} --demo                 no GPU? a simulated 8-GPU box with a small training job
  {PROG} --demo --once          the same box as one report (waits for the job's first
                                     measured step with op groups, up to {DEMO_WAIT_S:g} s)
  {PROG} --replay last          the last recorded run in the anatomy pane (← → to move)
  {PROG} plan ./my-model/config.json --batch-size 8 --seq-len 1024 --precision bf16 --gpu A100-40GB
"""


class _Options:
    """What the monitor and --once read from the command line (argparse's Namespace, minus argparse)."""

    def __init__(
        self, once: bool = False, json: bool = False, demo: bool = False, ascii: bool = False
    ) -> None:
        self.once = once
        self.json = json
        self.demo = demo
        self.ascii = ascii
        self.interval = DEFAULT_INTERVAL
        self.only = self.user = self.pid = None  # no filter flags on this path
        self.process_filter = None
        self.replay = None  # --replay goes through the parser

def interval_seconds(text: str) -> float:
    """argparse type for --interval: a finite number of seconds within [MIN_INTERVAL, MAX_INTERVAL]."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or not MIN_INTERVAL <= value <= MAX_INTERVAL:
        raise argparse.ArgumentTypeError(
            f"must be between {MIN_INTERVAL:g} and {MAX_INTERVAL:g} seconds, got {text!r}"
        )
    return value


def build_parser() -> argparse.ArgumentParser:
    import argparse

    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--once", action="store_true", help="print one report and exit (no live monitor)")
    parser.add_argument(
        "--json", action="store_true", help="with --once: one JSON document instead of the text report"
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="a simulated 8-GPU box with a small CPU training job: try it without a GPU",
    )
    parser.add_argument(
        "--interval",
        type=interval_seconds,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"refresh interval of the live monitor, {MIN_INTERVAL:g} to {MAX_INTERVAL:g} "
        f"(default {DEFAULT_INTERVAL:g})",
    )
    parser.add_argument(
        "--ascii",
        action="store_true",
        help="draw with ASCII only: no box drawing, blocks or symbols (automatic when the locale is not "
        "UTF-8); NO_COLOR=1 or TERM=dumb turn colour off",
    )
    parser.add_argument(
        "--replay",
        metavar="RUN",
        help="open a recorded run (an id from 'runs', a record file, or 'last') in the anatomy pane",
    )
    filters = parser.add_argument_group(
        "filters (the monitor and --once; in the monitor u, g and P toggle them for the selected process)"
    )
    filters.add_argument(
        "--only",
        action="append",
        metavar="GPU[,GPU]",
        help="show only these GPUs (indices as nvidia-smi numbers them) and their processes",
    )
    filters.add_argument(
        "--user",
        action="append",
        nargs="?",
        const="",
        metavar="USER[,USER]",
        help="show only these users' processes; --user alone: your own",
    )
    filters.add_argument("--pid", action="append", metavar="PID[,PID]", help="show only these processes")
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {__version__}", help="print the version and exit"
    )
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace | _Options:
    argv = list(argv)
    if "--once" in argv and _SIMPLE_FLAGS.issuperset(argv):
        # The common one-shot invocations: no argparse import (~5 ms) for a parse this simple.
        return _Options(once=True, json="--json" in argv, demo="--demo" in argv, ascii="--ascii" in argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.json and not args.once:
        parser.error("--json only goes with --once")
    from tui.sources.filters import FilterError, from_args

    try:
        args.process_filter = from_args(args.only, args.user, args.pid)
    except FilterError as exc:
        parser.error(str(exc))
    return args


# ------------------------------------------------------------------------------------------ demo
# ------------------------------------------------------------------------------------------ once
def may_have_publishers() -> bool:
    """A cheap pre-check before loading the anatomy side (~15 ms of imports) for --once.

    Looks for any ``anatomy-*`` entry in every directory ``anatomy.protocol.runtime_dir`` could pick
    (a superset: a false "maybe" only costs the imports; a false "no" would hide a training process).
    """
    from anatomy.rundir import candidate_dirs

    candidates = candidate_dirs()
    for directory in candidates:
        try:
            with os.scandir(directory) as entries:
                if any(e.name.startswith("anatomy-") for e in entries):
                    return True
        except OSError:
            continue
    return False


def _training(machine: MachineSnapshot, as_json: bool) -> Any:
    """Each publishing training process's anatomy for --once (None when none publishes)."""
    if not may_have_publishers():
        return None
    try:
        from tui.sources.anatomy_source import poll_once

        reading = poll_once(wait_s=ONCE_WAIT_S)
        if reading.errors:
            # The source's own refusal (a directory someone else could have planted in): one line each.
            from tui.sanitize import clean

            for error in reading.errors:
                print(f"{PROG}: training processes not shown: {clean(error.message)}", file=sys.stderr)
        processes = list(reading.processes)
        if not processes:
            return None
        if as_json:
            from tui.report.anatomy_json import jobs_json, training_json

            return {"training": training_json(processes, machine), "jobs": jobs_json(processes)}
        from tui.report.anatomy_text import render_training_text

        return render_training_text(processes, machine)
    except Exception as exc:  # the GPU report stands on its own
        print(f"{PROG}: training processes not shown: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def machine_once(
    omit: Sequence[str] = (), nvml_unavailable: str | None = None
) -> tuple[MachineSnapshot, int]:
    """One machine snapshot for a one-shot report, asking NVML only for what is printed (``omit``)."""
    from tui.sources.machine import read_once
    from tui.sources.nvml import NvmlSource

    return read_once(NvmlSource(omit=omit, unavailable_reason=nvml_unavailable), close=True)


def run_once(as_json: bool, nvml_unavailable: str | None = None, process_filter: Any = None) -> int:
    machine, calls = machine_once(() if as_json else TEXT_OMITS, nvml_unavailable)
    if process_filter is not None and process_filter.active:
        for index in process_filter.unknown_gpus(machine.gpus):
            print(f"{PROG}: --only {index}: no such GPU here", file=sys.stderr)
        machine = process_filter.apply(machine)
    training = _training(machine, as_json)
    if not machine.nvml.available:
        print(f"{PROG}: no GPU shown: {machine.nvml.reason}", file=sys.stderr)
    if as_json:
        import json

        from tui.report.once_json import render_json

        parts = training or {}
        document = render_json(machine, parts.get("training"), nvml_calls=calls, jobs=parts.get("jobs"))
        out = json.dumps(document, indent=2) + "\n"
    else:
        from tui.report.smi_text import render_text

        out = render_text(machine, training)
    try:
        sys.stdout.write(out)
        sys.stdout.flush()
    except BrokenPipeError:
        # `anatomy-top --once | head`: the reader chose to stop; say nothing (as a tool killed by SIGPIPE),
        # but the status says the report was cut short.
        _silence_stdout()
        return 128 + 13
    except (OSError, ValueError) as exc:
        _silence_stdout()
        print(f"{PROG}: the report could not be written to standard output: {exc}", file=sys.stderr)
        return 1
    return 0


def _reserve_std_streams() -> tuple[bool, bool]:
    """Whether standard output and standard error are open. A closed one is put on /dev/null: its file
    descriptor must not be handed to the next file we open (a socket or NVML's device would then
    receive our report), and ``print(file=sys.stderr)`` with ``sys.stderr`` None writes to stdout."""
    state = []
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
            is_open = getattr(sys, name) is not None
        except OSError:
            is_open = False
        if not is_open:
            try:
                null = os.open(os.devnull, os.O_WRONLY)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
                setattr(sys, name, open(fd, "w", closefd=False))  # noqa: SIM115 - lives as long as we do
            except OSError:
                pass
        state.append(is_open)
    return state[0], state[1]


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
    return int(plan_main(list(argv), lean=True) or 0)  # this process only plans


def run_exporter(argv: Sequence[str]) -> int:
    from tui.exporter.server import main as exporter_main

    return exporter_main(list(argv))


def run_monitor(args: Any, nvml_unavailable: str | None = None, starting_pid: int | None = None) -> int:
    """The live monitor: read NVML and draw the first frame from it, then load Textual and hand over."""
    from tui import first_frame
    from tui.sources.machine import read_once
    from tui.sources.nvml import NvmlSource
    from tui.terminal import detect

    caps = detect(ascii_only=bool(getattr(args, "ascii", False)))
    interval = float(getattr(args, "interval", DEFAULT_INTERVAL) or DEFAULT_INTERVAL)
    nvml = NvmlSource(unavailable_reason=nvml_unavailable)
    first, _ = read_once(nvml)
    from tui.sources import on_screen

    first = on_screen.machine(first)  # the start-up frame draws other processes' names too
    process_filter = getattr(args, "process_filter", None)
    from tui import startup_signals

    previous = startup_signals.install(first_frame.leave)
    try:
        painted = first_frame.paint(process_filter.apply(first) if process_filter else first, caps, interval)
        try:
            from tui.app import run_app
        except ImportError as exc:
            if painted:
                first_frame.leave()
            nvml.close()
            print(f"{PROG}: the monitor cannot start: {exc}", file=sys.stderr)
            return 1
        return int(
            run_app(
                args,
                nvml=nvml,
                first_machine=first,
                caps=caps,
                starting_pid=starting_pid,
                painted=painted,
            )
            or 0
        )
    except startup_signals.Signalled as stop:
        return stop.status
    finally:
        startup_signals.restore(previous)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "plan":
        return run_plan(argv[1:])
    if argv and argv[0] == "exporter":
        return run_exporter(argv[1:])
    if argv and argv[0] in ("runs", "report"):  # the flight recorder's runs (tui.runreport)
        from tui.runreport import cli as runreport

        return (runreport.runs_main if argv[0] == "runs" else runreport.report_main)(argv[1:])
    stdout_open, stderr_open = _reserve_std_streams()
    args = parse_args(argv)  # bad input: argparse prints usage and exits 2
    if args.once and not stdout_open:
        print(f"{PROG}: standard output is closed: the report has nowhere to go", file=sys.stderr)
        return 1
    if not args.once and not stderr_open:
        # Textual draws on standard error.
        print(f"{PROG}: standard error is closed: the monitor has no terminal to draw on", file=sys.stdout)
        return 1
    replay = getattr(args, "replay", None)
    if replay:
        from tui.replay import run_replay

        return run_replay(replay)
    stop: Callable[[], None] | None = None
    try:
        starting_pid = None
        if args.demo:
            stop, starting_pid = start_demo(once=args.once)
        nvml_unavailable = install_simulation()
        if args.once:
            return run_once(args.json, nvml_unavailable, args.process_filter)
        return run_monitor(args, nvml_unavailable, starting_pid)
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
