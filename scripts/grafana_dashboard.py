"""Writes the Grafana dashboard for ``anatomy-top exporter`` (deploy/grafana/anatomy-top.json).

    python scripts/grafana_dashboard.py [OUT]      # default: deploy/grafana/anatomy-top.json

The dashboard is generated so that its queries are readable here, in one place, and checked by the
tests (tests/exporter/test_deploy.py: every metric it names is one the exporter emits; and a real
Prometheus, scraping a real training job, answers every query). Grafana 10+ (``timeseries`` panels,
schema 39); import it with the Prometheus data source that scrapes the exporters.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "deploy" / "grafana" / "anatomy-top.json"
DS = {"type": "prometheus", "uid": "${datasource}"}

# The series of the job chosen at the top of the dashboard.
JOB = 'instance=~"$instance", run_id=~"$run_id", rank=~"$rank"'
NODE = 'instance=~"$instance"'
# What a rank's memory stack is made of: the components at the step's peak (they sum to the peak), plus
# what sits outside the allocator's tensors (CUDA context, allocator cache; the runtime heap on CPU).
# Together they are the process's footprint, the figure NVML reports for it on CUDA.
OUTSIDE = "cuda_context|allocator_cache|runtime"
STACK = f'anatomy_memory_at_peak_bytes{{{JOB}}} or anatomy_memory_bytes{{{JOB}, component=~"{OUTSIDE}"}}'


def target(
    expr: str, legend: str, ref: str = "A", instant: bool = False, table: bool = False
) -> dict[str, Any]:
    t: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}
    if instant:
        t.update(instant=True, range=False)
    if table:
        t["format"] = "table"
    return t


_next_id = 0


def panel(
    title: str,
    targets: list[dict[str, Any]],
    grid: tuple[int, int, int, int],
    unit: str = "short",
    kind: str = "timeseries",
    description: str = "",
    stacked: bool = False,
    overrides: list[dict[str, Any]] | None = None,
    options: dict[str, Any] | None = None,
    repeat: str | None = None,
    transformations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    global _next_id
    _next_id += 1
    x, y, w, h = grid
    custom: dict[str, Any] = {}
    if kind == "timeseries":
        custom = {"lineWidth": 1, "fillOpacity": 70 if stacked else 10, "showPoints": "never"}
        custom["stacking"] = {"mode": "normal" if stacked else "none", "group": "A"}
    p: dict[str, Any] = {
        "id": _next_id,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": overrides or []},
        "options": options
        or {"legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull"]}},
    }
    if repeat:
        p.update(repeat=repeat, repeatDirection="h", maxPerRow=4)
    if transformations:
        p["transformations"] = transformations
    return p


def row(title: str, y: int) -> dict[str, Any]:
    global _next_id
    _next_id += 1
    return {
        "id": _next_id,
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
        "panels": [],
    }


def line_override(series: str) -> dict[str, Any]:
    """A series drawn as an unstacked dashed line over a stacked area (NVML's figure over the anatomy)."""
    return {
        "matcher": {"id": "byName", "options": series},
        "properties": [
            {"id": "custom.stacking", "value": {"mode": "none", "group": "A"}},
            {"id": "custom.fillOpacity", "value": 0},
            {"id": "custom.lineWidth", "value": 2},
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "color", "value": {"mode": "fixed", "fixedColor": "white"}},
        ],
    }


def variable(name: str, query: str, label: str, multi: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"var-{name}"},
        "definition": query,
        "refresh": 2,  # on time range change: new jobs appear
        "multi": multi,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 3,  # numerical ascending: rank 2 before rank 10
    }


def dashboard() -> dict[str, Any]:
    panels = [
        row("Job: memory and time per rank", 0),
        panel(
            "Memory by component, rank $rank",
            [
                target(STACK, "{{component}}"),
                target(f"anatomy_rank_gpu_memory_used_bytes{{{JOB}}}", "NVML (process)", "B"),
            ],
            (0, 1, 12, 9),
            unit="bytes",
            stacked=True,
            repeat="rank",
            description=(
                "The rank's memory at its step's peak, by component (weights, optimizer states, gradients, "
                "activations, temporaries...), stacked on what lies outside the tensors (CUDA context, "
                "allocator cache; the runtime heap on CPU). The dashed line is NVML's figure for the "
                "process: on CUDA the stack reaches it."
            ),
            overrides=[line_override("NVML (process)")],
        ),
        panel(
            "Step time per rank",
            [target(f"anatomy_step_duration_seconds{{{JOB}}}", "{{instance}} rank {{rank}}")],
            (0, 10, 12, 8),
            unit="s",
            description="Wall time of each rank's latest step; every collective waits for the slowest rank.",
        ),
        panel(
            "Straggler: slowest rank / median rank",
            [
                target(
                    f"max by (run_id) (anatomy_step_duration_seconds{{{JOB}}})"
                    f" / quantile by (run_id) (0.5, anatomy_step_duration_seconds{{{JOB}}})",
                    "{{run_id}}",
                )
            ],
            (12, 10, 6, 8),
            unit="x",
            kind="stat",
            description="1.0: every rank keeps pace. Above ~1.2 one rank holds the others back.",
            options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "value", "graphMode": "area"},
        ),
        panel(
            "Step phases (mean over ranks)",
            [target(f"avg by (phase) (anatomy_phase_duration_seconds{{{JOB}}})", "{{phase}}")],
            (18, 10, 6, 8),
            unit="s",
            stacked=True,
            description="Forward, backward, optimizer and the rest of the step; they sum to the step time.",
        ),
        panel(
            "Op-group share of step time",
            [
                target(
                    f"sum by (group) (anatomy_op_group_duration_seconds{{{JOB}}})"
                    f" / ignoring(group) group_left sum(anatomy_op_group_duration_seconds{{{JOB}}})",
                    "{{group}}",
                    instant=True,
                )
            ],
            (0, 18, 8, 8),
            unit="percentunit",
            kind="piechart",
            description=(
                "Where the sampled steps' time goes: tensor contractions (matmuls), statistical "
                "normalizations, element-wise ops, the optimizer, the rest."
            ),
            options={
                "reduceOptions": {"calcs": ["lastNotNull"]},
                "pieType": "donut",
                "legend": {"displayMode": "table", "placement": "right", "values": ["percent"]},
            },
        ),
        panel(
            "Throughput (sum over ranks)",
            [
                target(f"sum(anatomy_samples_per_second{{{JOB}}})", "samples/s"),
                target(f"sum(anatomy_tokens_per_second{{{JOB}}})", "tokens/s", "B"),
            ],
            (8, 18, 8, 8),
            unit="short",
        ),
        panel(
            "MFU per rank",
            [target(f"anatomy_mfu_ratio{{{JOB}}}", "rank {{rank}}")],
            (16, 18, 8, 8),
            unit="percentunit",
            description="Model FLOPs utilization: achieved FLOP/s over the GPU's peak for the precision.",
        ),
        panel(
            "Ranks",
            [target(f"anatomy_rank_info{{{JOB}}}", "", instant=True, table=True)],
            (0, 26, 24, 6),
            kind="table",
            options={"showHeader": True},
            transformations=[
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True},
                        "indexByName": {"run_id": 0, "rank": 1, "hostname": 2, "pid": 3, "gpu_uuid": 4},
                    },
                }
            ],
        ),
        row("Node: GPUs from NVML", 32),
        panel(
            "GPU memory: NVML vs the anatomy's sum",
            [
                target(f"anatomy_gpu_memory_used_bytes{{{NODE}}}", "{{instance}} GPU {{gpu}} NVML"),
                target(
                    "sum by (instance, UUID) (label_replace("
                    f"sum by (instance, run_id, rank) (anatomy_memory_at_peak_bytes{{{NODE}}}"
                    f' or anatomy_memory_bytes{{{NODE}, component=~"{OUTSIDE}"}})'
                    f" * on(instance, run_id, rank) group_left(gpu_uuid) anatomy_rank_info{{{NODE}}},"
                    ' "UUID", "$1", "gpu_uuid", "(.+)"))'
                    " * on(instance, UUID) group_left(gpu)"
                    f" group by (instance, UUID, gpu) (anatomy_gpu_up{{{NODE}}})",
                    "{{instance}} GPU {{gpu}} anatomy",
                    "B",
                ),
            ],
            (0, 33, 12, 8),
            unit="bytes",
            description=(
                "Per GPU: what NVML says is in use, and the sum of what the hooks of the training processes "
                "on it account for. The gap is processes without the hook, or memory outside PyTorch."
            ),
        ),
        panel(
            "GPU utilization",
            [target(f"anatomy_gpu_utilization_ratio{{{NODE}}}", "{{instance}} GPU {{gpu}}")],
            (12, 33, 12, 8),
            unit="percentunit",
        ),
        panel(
            "GPU power",
            [target(f"anatomy_gpu_power_watts{{{NODE}}}", "{{instance}} GPU {{gpu}}")],
            (0, 41, 8, 7),
            unit="watt",
        ),
        panel(
            "GPU temperature",
            [target(f"anatomy_gpu_temperature_celsius{{{NODE}}}", "{{instance}} GPU {{gpu}}")],
            (8, 41, 8, 7),
            unit="celsius",
        ),
        panel(
            "Uncorrected ECC errors, GPUs lost",
            [
                target(
                    f"anatomy_gpu_ecc_volatile_uncorrected_errors_total{{{NODE}}}",
                    "{{instance}} GPU {{gpu}} ECC",
                ),
                target(f"anatomy_gpu_up{{{NODE}}} == 0", "{{instance}} GPU {{gpu}} lost", "B"),
            ],
            (16, 41, 8, 7),
            unit="short",
        ),
        panel(
            "Who holds each GPU: memory per process",
            [
                target(
                    f"anatomy_process_gpu_memory_used_bytes{{{NODE}}}",
                    "{{instance}} GPU {{gpu}}: {{pid}} {{command}}",
                )
            ],
            (0, 48, 12, 8),
            unit="bytes",
            stacked=True,
            description=(
                "Every process on the GPUs, training with the hook or not: NVML's memory per process, "
                "stacked per GPU. Beyond the exporter's --max-processes, the smallest are left out."
            ),
        ),
        panel(
            "SM and memory-bandwidth use per process",
            [
                target(
                    f"anatomy_process_gpu_sm_utilization_ratio{{{NODE}}}",
                    "{{instance}} GPU {{gpu}}: {{pid}} {{command}} SM",
                ),
                target(
                    f"anatomy_process_gpu_memory_bandwidth_utilization_ratio{{{NODE}}}",
                    "{{instance}} GPU {{gpu}}: {{pid}} {{command}} memory",
                    "B",
                ),
            ],
            (12, 48, 12, 8),
            unit="percentunit",
            description="Each GPU process's share of its GPU's SM time and memory bandwidth (NVML).",
        ),
    ]
    return {
        "title": "anatomy-top: training anatomy",
        "uid": "anatomy-top",
        "description": (
            "Memory and time anatomy of training processes (anatomy-top exporter), and their GPUs."
        ),
        "tags": ["anatomy-top", "training", "gpu"],
        "editable": True,
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "graphTooltip": 1,
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                variable("instance", "label_values(anatomy_exporter_info, instance)", "Node"),
                variable(
                    "run_id", 'label_values(anatomy_rank_info{instance=~"$instance"}, run_id)', "Job (run id)"
                ),
                variable(
                    "rank",
                    'label_values(anatomy_rank_info{instance=~"$instance", run_id=~"$run_id"}, rank)',
                    "Rank",
                ),
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    global _next_id
    _next_id = 0
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
