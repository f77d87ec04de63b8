"""Start-up pieces shared by the monitor (``tui.cli``) and the exporter (``tui.exporter.server``): the one
place the simulated NVIDIA library is installed, and the demo's training job. Stdlib only at import."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

PROG = "anatomy-top"
SIMULATE_ENV = "ANATOMY_TOP_SIMULATE"
DEMO_WAIT_S = 60.0  # how long --demo --once waits for the demo's job's first measured step with op groups


def start_demo(once: bool) -> tuple[Callable[[], None], int | None]:
    """Point this process at the simulated 8-GPU box and start the demo's training job; return the
    function that ends it all and the job's PID. With ``once``, wait until the job has published a
    measured step with op groups, so the one report shows its whole anatomy (plain ``--demo`` starts the
    monitor right away, which says it is waiting for the job)."""
    from tui.demo import start_demo as start

    handle = start(train=True)
    if once and handle.train is not None:
        print(
            f"{PROG}: starting the demo's training job; waiting up to {DEMO_WAIT_S:g} s for its first "
            "measured step with op groups ...",
            file=sys.stderr,
            flush=True,
        )
        if not handle.wait_until_publishing(DEMO_WAIT_S, op_groups=True):
            print(
                f"{PROG}: timed out after {DEMO_WAIT_S:g} s: the demo's training job published no step with "
                f"op groups; the report shows what it has (its log: {handle.train_log})",
                file=sys.stderr,
            )
    pid = getattr(handle, "train_pid", None)
    return handle.stop, pid if isinstance(pid, int) else None


def install_simulation() -> str | None:
    """Install the simulated NVIDIA library named by ANATOMY_TOP_SIMULATE, if set: the one place it is
    installed. Returns why NVML cannot be used when the scenario is broken (the reports and the monitor
    then say so instead of showing GPUs), else None."""
    if not os.environ.get(SIMULATE_ENV, "").strip():
        return None
    try:
        from tui.simnvml import install_from_env

        install_from_env()
    except Exception as exc:  # a broken scenario file must not crash anything
        return f"simulated NVML ({SIMULATE_ENV}) could not be installed: {exc}"
    return None
