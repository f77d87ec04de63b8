"""One GPU's fields as nvidia-smi shows them, read through the NVML source's choke point (``get``, which
turns an NVML error into None and tries older symbols in turn) in three tiers: identity, slow, fast."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Collection

from tui.sources.nvml_reading import decode, fast_fields, pci_bus_id

# typing is not imported at run time (~3 ms of --once start-up); the names are for type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    # The choke point: (symbol, call) alternatives -> the first the driver has, None on an NVML error.
    Get = Callable[..., Any]
    # A call of an NVML symbol pynvml has no wrapper for (older variants); raises NVMLError.
    Raw = Callable[..., None]

_PSTATE_UNKNOWN = 32
_COMPUTE_MODES = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}


def read_identity(pynvml: Any, get: Get, raw: Raw, h: Any, omit: Collection[str]) -> dict[str, Any]:
    """The fields that never change: name, UUID, PCI bus id."""
    return {
        "name": decode(get(("nvmlDeviceGetName", lambda: pynvml.nvmlDeviceGetName(h)))),
        "uuid": None
        if "uuid" in omit
        else decode(get(("nvmlDeviceGetUUID", lambda: pynvml.nvmlDeviceGetUUID(h)))),
        "bus_id": _bus_id(pynvml, get, raw, h),
    }


def _bus_id(pynvml: Any, get: Get, raw: Raw, h: Any) -> str | None:
    def older(symbol: str) -> Callable[[], Any]:
        def call() -> Any:
            info = pynvml.nvmlPciInfo_t()
            raw(symbol, h, ctypes.byref(info))
            return info

        return call

    info = get(
        ("nvmlDeviceGetPciInfo_v3", lambda: pynvml.nvmlDeviceGetPciInfo_v3(h)),
        ("nvmlDeviceGetPciInfo_v2", older("nvmlDeviceGetPciInfo_v2")),
        ("nvmlDeviceGetPciInfo", older("nvmlDeviceGetPciInfo")),
    )
    if info is None:
        return None
    return pci_bus_id(info)


def read_slow(pynvml: Any, get: Get, h: Any, omit: Collection[str]) -> dict[str, Any]:
    """Modes, limits, ECC, fan, temperature, performance state: the fields that change slowly."""

    def unless_omitted(field: str, *alternatives: tuple[str, Callable[[], Any]]) -> Any:
        return None if field in omit else get(*alternatives)

    persistence = unless_omitted(
        "persistence_mode",
        ("nvmlDeviceGetPersistenceMode", lambda: pynvml.nvmlDeviceGetPersistenceMode(h)),
    )
    display = unless_omitted(
        "display_active", ("nvmlDeviceGetDisplayActive", lambda: pynvml.nvmlDeviceGetDisplayActive(h))
    )
    ecc = get(
        (
            "nvmlDeviceGetTotalEccErrors",
            lambda: pynvml.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            ),
        )
    )
    fan = get(("nvmlDeviceGetFanSpeed", lambda: pynvml.nvmlDeviceGetFanSpeed(h)))
    temperature = get(
        (
            "nvmlDeviceGetTemperatureV",
            lambda: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
        ),
        (
            "nvmlDeviceGetTemperature",
            lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        ),
    )
    pstate = unless_omitted(
        "performance_state",
        ("nvmlDeviceGetPerformanceState", lambda: pynvml.nvmlDeviceGetPerformanceState(h)),
        ("nvmlDeviceGetPowerState", lambda: pynvml.nvmlDeviceGetPowerState(h)),
    )
    limit_mw = get(
        ("nvmlDeviceGetPowerManagementLimit", lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h)),
        ("nvmlDeviceGetEnforcedPowerLimit", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h)),
    )
    compute = unless_omitted(
        "compute_mode", ("nvmlDeviceGetComputeMode", lambda: pynvml.nvmlDeviceGetComputeMode(h))
    )
    mig = get(("nvmlDeviceGetMigMode", lambda: pynvml.nvmlDeviceGetMigMode(h)))
    return {
        "persistence_mode": None if persistence is None else bool(persistence),
        "display_active": None if display is None else bool(display),
        "ecc_volatile_uncorrected": None if ecc is None else int(ecc),
        "fan_percent": None if fan is None else int(fan),
        "temperature_c": None if temperature is None else int(temperature),
        "performance_state": None if pstate is None or pstate == _PSTATE_UNKNOWN else int(pstate),
        "power_limit_w": None if limit_mw is None else limit_mw / 1000.0,
        "compute_mode": None if compute is None else _COMPUTE_MODES.get(int(compute)),
        "mig_mode": None if mig is None else bool(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE),
    }


def read_fast(pynvml: Any, get: Get, h: Any) -> dict[str, Any]:
    """Memory, utilization and power: the fields read every fast refresh."""
    memory = get(
        (
            "nvmlDeviceGetMemoryInfo_v2",
            lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
        ),
        ("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(h)),
    )
    util = get(("nvmlDeviceGetUtilizationRates", lambda: pynvml.nvmlDeviceGetUtilizationRates(h)))
    power_mw = get(("nvmlDeviceGetPowerUsage", lambda: pynvml.nvmlDeviceGetPowerUsage(h)))
    return fast_fields(memory, util, power_mw)
