"""Run by test_startup_signals in a pseudo-terminal: the monitor's app, as ``run_app`` runs it, handed
over and started while the test hangs the terminal up. Writes "run" on fd ``argv[1]`` just before
``app.run()``, then its exit status. Environment: ANATOMY_TOP_SIMULATE, ANATOMY_TOP_DIR."""

from __future__ import annotations

import os
import sys

from tui import first_frame, startup_signals
from tui.app import AnatomyTopApp
from tui.sources.anatomy_source import AnatomySource
from tui.sources.machine import MachineSource
from tui.startup import install_simulation


def main() -> int:
    report = int(sys.argv[1])
    install_simulation()
    startup_signals.install(first_frame.leave)
    app = AnatomyTopApp(machine_source=MachineSource(), anatomy_source=AnatomySource())
    startup_signals.hand_over(app)
    os.write(report, b"run\n")
    try:
        app.run()
    except Exception as exc:  # what run_app does: a failure with a pending hang-up is the hang-up
        early = startup_signals.pending()
        status = 128 + early if early is not None else 1
        os.write(report, f"{status} {type(exc).__name__}\n".encode())
        return status
    os.write(report, f"{app.return_code}\n".encode())
    return app.return_code or 0


if __name__ == "__main__":
    sys.exit(main())
