"""The ``training`` list of ``anatomy-top --once --json``: for each publishing process its state, its
latest hello and snapshot as the wire protocol's dicts, and the rows reconciled against NVML."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from anatomy import protocol
from tui.sources.anatomy_source import TrainingProcess
from tui.sources.jobs import jobs_of
from tui.sources.model import MachineSnapshot
from tui.sources.reconcile import Reconciled, nvml_process_bytes, reconcile


def reconciled_dict(rec: Reconciled) -> dict[str, Any]:
    return {
        "total": rec.total,
        "total_source": rec.total_source,
        "measured_sum": rec.measured_sum,
        "reconciles": rec.reconciles,
        "managed_bytes": rec.managed_bytes,  # paged optimizer states (CUDA managed memory), not a row
        "note": rec.note,
        "parameter_count": rec.parameter_count,
        "trainable_parameter_count": rec.trainable_parameter_count,
        "at_peak": rec.at_peak,
        "peak_bytes": rec.peak_bytes,
        "peak_phase": rec.peak_phase,
        "at_peak_step": rec.at_peak_step,
        "rows": [
            {
                "component": row.component.value,
                "label": row.label,
                "bytes": row.bytes,
                "max_bytes": row.max_bytes,
                "share": row.share,
                "bytes_per_param": row.bytes_per_param,
                "expected_bytes_per_param": row.expected_bytes_per_param,
            }
            for row in rec.rows
        ],
    }


def process_dict(proc: TrainingProcess, machine: MachineSnapshot | None = None) -> dict[str, Any]:
    nvml = nvml_process_bytes(proc.pid, machine.processes) if machine is not None else None
    reconciled = None
    if proc.snapshot is not None:
        reconciled = reconciled_dict(reconcile(proc.hello, proc.snapshot, nvml))
    return {
        "pid": proc.pid,
        "state": proc.state,
        "error": proc.error,
        "oom": proc.oom,
        "rank_group": proc.rank_group,
        "nvml_process_bytes": nvml,
        "hello": protocol.to_dict(proc.hello) if proc.hello is not None else None,
        "snapshot": protocol.to_dict(proc.snapshot) if proc.snapshot is not None else None,
        "reconciled": reconciled,
        "memory_history": list(proc.memory_history),
        "step_time_history": list(proc.step_time_history),
    }


def training_json(
    processes: Sequence[TrainingProcess], machine: MachineSnapshot | None = None
) -> list[dict[str, Any]]:
    """JSON-ready (no NaN, plain types) entries for ``render_json(machine, training=...)``."""
    return [process_dict(p, machine) for p in processes]


def jobs_json(processes: Sequence[TrainingProcess]) -> list[dict[str, Any]]:
    """Each multi-rank job: its ranks (memory by component, step time), its total and its slowest rank."""
    out = []
    for job in jobs_of(list(processes)):
        out.append(
            {
                "key": job.key,
                "run_id": job.run_id,
                "world_size": job.world_size,
                "model_class": job.model_class,
                "ranks": [
                    {
                        "rank": r.rank,
                        "pid": r.pid,
                        "state": r.state,
                        "step": r.step,
                        "step_s": r.step_s,
                        "peak_bytes": r.peak,
                        "memory": dict(r.memory),
                    }
                    for r in job.ranks
                ],
                "total": {"peak_bytes": job.total_peak, "memory": dict(job.total_memory)},
                "slowest_rank": job.slowest_rank,
                "straggler": job.straggler,
            }
        )
    return out
