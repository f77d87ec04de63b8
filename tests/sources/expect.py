"""What the data layer should report for a scenario, computed from the scenario itself (independently of
the code under test): the oracle for field-by-field comparisons."""

from __future__ import annotations

from typing import Any

from tui.simnvml import Scenario

COMPUTE_MODES = {"Default", "Exclusive_Process", "Prohibited", "Exclusive_Thread"}


def used_memory(scenario: Scenario, index: int, t: float) -> int:
    gpu = scenario.gpus[index]
    procs = sum(int(p.used_memory.at(t)) for p in scenario.processes if p.gpu_index == index)
    return min(procs + gpu.memory_other_used, gpu.memory_total - gpu.memory_reserved)


def gpu_fields(scenario: Scenario, index: int, t: float) -> dict[str, Any]:
    g = scenario.gpus[index]
    used = used_memory(scenario, index, t)
    assert g.compute_mode in COMPUTE_MODES
    return {
        "index": index,
        "name": g.name,
        "uuid": g.uuid,
        "persistence_mode": g.persistence_mode,
        "bus_id": g.bus_id,
        "display_active": g.display_active,
        "ecc_volatile_uncorrected": g.ecc_volatile_uncorrected,
        "fan_percent": None if g.fan_percent is None else round(g.fan_percent.at(t)),
        "temperature_c": round(g.temperature_c.at(t)),
        "performance_state": g.performance_state,
        "power_w": round(g.power_w.at(t) * 1000) / 1000,
        "power_limit_w": g.power_limit_w,
        "memory_total": g.memory_total,
        "memory_used": used,
        "memory_free": g.memory_total - g.memory_reserved - used,
        "memory_reserved": g.memory_reserved,
        "gpu_util": None if g.mig_mode else round(g.gpu_util.at(t)),
        "memory_util": None if g.mig_mode else round(g.memory_util.at(t)),
        "compute_mode": g.compute_mode,
        "mig_mode": g.mig_mode,
        "lost": False,
        "error": None,
    }


def processes(scenario: Scenario, t: float) -> dict[tuple[int, int], dict[str, Any]]:
    """(gpu index, pid) → type, memory and MIG ids as NVML lists them."""
    out = {}
    for p in scenario.processes:
        mig = scenario.gpus[p.gpu_index].mig_mode
        out[(p.gpu_index, p.pid)] = {
            "type": p.type,
            "gpu_memory": int(p.used_memory.at(t)),
            "gpu_instance_id": p.gpu_instance_id if mig else None,
            "compute_instance_id": p.compute_instance_id if mig else None,
        }
    return out
