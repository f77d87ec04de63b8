"""Putting the simulated library where pynvml looks for libnvidia-ml, and taking it away again.

pynvml loads the library lazily in ``nvmlInit`` only while ``pynvml.nvmlLib`` is None, then looks
symbols up with ``getattr(nvmlLib, name)`` and caches hits. ``install`` assigns a
:class:`SimulatedNvml` to ``pynvml.nvmlLib`` and clears that cache, so every pynvml function (and
nvitop's or gpustat's wrappers around them) runs unmodified against the simulated box.

"Library not found" (``Faults.library_missing`` or ``install(..., library_missing=True)``): nothing
is assigned, and pynvml's loader (``pynvml.CDLL``) is replaced by one that raises OSError for the
NVML library, so ``nvmlInit`` raises NVMLError_LibraryNotFound exactly as on a machine without the
driver, even on a machine that has one. ``uninstall`` restores the real loader.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from tui.simnvml.curves import ScenarioError
from tui.simnvml.library import Clock, SimulatedNvml
from tui.simnvml.scenario import Scenario

SIMULATE_ENV = "ANATOMY_TOP_SIMULATE"
CALLS_ENV = "ANATOMY_TOP_SIM_CALLS"

_state_lock = threading.Lock()
_installed: SimulatedNvml | None = None
_real_cdll: Any = None


def _missing_library_loader(real_cdll: Any) -> Any:
    def load(name: Any, *args: Any, **kwargs: Any) -> Any:
        if "nvidia-ml" in str(name) or "nvml" in str(name).lower():
            raise OSError(f"{name}: cannot open shared object file: No such file or directory (simulated)")
        return real_cdll(name, *args, **kwargs)

    return load


def _clear_pynvml_caches(pynvml: Any) -> None:
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml._nvmlLib_refcount = 0


def install(
    scenario: Scenario, clock: Clock | None = None, *, library_missing: bool | None = None
) -> SimulatedNvml:
    """Make pynvml use a simulated library for ``scenario``; returns it (for ``.calls`` etc.).

    ``clock`` (seconds, monotonic) drives the scenario's curves and faults; default ``time.monotonic``.
    ``library_missing`` overrides ``scenario.faults.library_missing``. Installing again replaces
    the previous simulation.
    """
    import pynvml

    global _installed, _real_cdll
    missing = scenario.faults.library_missing if library_missing is None else library_missing
    lib = SimulatedNvml(scenario, clock)
    with _state_lock, pynvml.libLoadLock:
        if _real_cdll is None:
            _real_cdll = pynvml.CDLL
        if missing:
            pynvml.CDLL = _missing_library_loader(_real_cdll)
            pynvml.nvmlLib = None
        else:
            pynvml.CDLL = _real_cdll
            pynvml.nvmlLib = lib
        _clear_pynvml_caches(pynvml)
        _installed = lib
    return lib


def uninstall() -> None:
    """Restore pynvml to its pristine state: no library loaded, real loader, empty caches."""
    import pynvml

    global _installed, _real_cdll
    with _state_lock, pynvml.libLoadLock:
        if _real_cdll is not None:
            pynvml.CDLL = _real_cdll
            _real_cdll = None
        pynvml.nvmlLib = None
        _clear_pynvml_caches(pynvml)
        _installed = None


def installed() -> SimulatedNvml | None:
    """The simulated library installed now, if any."""
    return _installed


def write_calls(lib: SimulatedNvml, path: str | os.PathLike[str]) -> None:
    """Write ``lib``'s call counts as JSON (``{"total", "calls", "missing", ...}``)."""
    Path(path).write_text(json.dumps(lib.counts_json(), indent=1) + "\n", encoding="utf-8")


def write_calls_at_exit(lib: SimulatedNvml, path: str) -> None:
    try:
        write_calls(lib, path)
    except OSError as exc:
        print(f"anatomy-top: cannot write NVML call counts to {path}: {exc}", file=sys.stderr)


def install_from_env(environ: dict[str, str] | None = None) -> SimulatedNvml | None:
    """Install the scenario named by ``ANATOMY_TOP_SIMULATE`` (a JSON file), if set.

    Returns None when the variable is unset or empty. Raises :class:`ScenarioError` (a ValueError
    with a message fit for users) when the file is unreadable or invalid. When
    ``ANATOMY_TOP_SIM_CALLS`` names a file, the call counts are written there at exit.
    """
    env = os.environ if environ is None else environ
    path = env.get(SIMULATE_ENV, "").strip()
    if not path:
        return None
    scenario = Scenario.from_json(path)
    lib = install(scenario)
    calls_path = env.get(CALLS_ENV, "").strip()
    if calls_path:
        atexit.register(write_calls_at_exit, lib, calls_path)
    return lib


__all__ = [
    "CALLS_ENV",
    "SIMULATE_ENV",
    "ScenarioError",
    "install",
    "install_from_env",
    "installed",
    "uninstall",
]
