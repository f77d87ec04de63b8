"""A simulated NVIDIA management library, for tests and ``anatomy-top --demo``.

The real code path runs unchanged: pynvml (and nvitop, gpustat) call what they believe is
libnvidia-ml, and get a scenario's GPUs, processes and faults.

    from tui.simnvml import Scenario, install, uninstall
    lib = install(Scenario.demo_box(n_gpus=8, pids=[...]))   # pynvml now talks to the simulation
    ...
    lib.calls, lib.total_calls                               # NVML calls per symbol, in all
    uninstall()
"""

from tui.simnvml.curves import Curve, ScenarioError
from tui.simnvml.install import (
    CALLS_ENV,
    SIMULATE_ENV,
    install,
    install_from_env,
    installed,
    uninstall,
    write_calls,
)
from tui.simnvml.library import SimulatedNvml, exported_symbols
from tui.simnvml.scenario import (
    FIELDS,
    OLD_DRIVER_MISSING,
    Faults,
    Scenario,
    SimGpu,
    SimMigDevice,
    SimProcess,
)

__all__ = [
    "CALLS_ENV",
    "FIELDS",
    "OLD_DRIVER_MISSING",
    "SIMULATE_ENV",
    "Curve",
    "Faults",
    "Scenario",
    "ScenarioError",
    "SimGpu",
    "SimMigDevice",
    "SimProcess",
    "SimulatedNvml",
    "exported_symbols",
    "install",
    "install_from_env",
    "installed",
    "uninstall",
    "write_calls",
]
