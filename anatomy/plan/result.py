"""A plan's answer: the anatomy of one training step, where its peak is, and whether it fits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from anatomy.plan.gpu import GpuMemory
from anatomy.plan.settings import OPTIMIZER_KINDS, PlanSettings, Task
from anatomy.plan.workload import Workload
from anatomy.vocabulary import Component, OptimizerKind, Phase, Source, expected_bytes_per_param


@dataclass
class PlanResult:
    model: str
    model_class: str
    task: Task
    settings: PlanSettings
    workload: Workload
    parameter_count: int
    trainable_parameters: int
    components: dict[Component, int | None]  # each at its own maximum (what the hook reports)
    sources: dict[Component, Source]
    at_peak: dict[Component, int]  # what is live at the predicted peak (sums to peak_bytes)
    peak_bytes: int  # tensors only (CUDA: torch.cuda.max_memory_allocated)
    peak_phase: Phase
    phase_peaks: dict[Phase, int]
    total_bytes: int  # peak + CUDA context + allocator headroom
    gpu: GpuMemory | None  # None: the CPU target, fitted to nothing
    kv_cache_bytes: int = 0  # the cache the forward returns, held by the loop's `out`
    outputs_kept_bytes: int = 0  # what the loop's `out` holds after backward (logits, the KV cache, ...)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def gpu_name(self) -> str | None:
        return None if self.gpu is None else self.gpu.name

    @property
    def gpu_bytes(self) -> int | None:
        return None if self.gpu is None else self.gpu.total_bytes

    @property
    def gpu_source(self) -> str:
        return "cpu target" if self.gpu is None else self.gpu.source

    @property
    def fits(self) -> bool | None:
        return None if self.gpu is None else self.total_bytes <= self.gpu.total_bytes

    @property
    def spare_bytes(self) -> int | None:
        return None if self.gpu is None else self.gpu.total_bytes - self.total_bytes

    @property
    def optimizer_kind(self) -> OptimizerKind:
        return OPTIMIZER_KINDS[self.settings.optimizer]

    def expected_bytes_per_param(self) -> dict[Component, float | None]:
        return {
            c: expected_bytes_per_param(c, self.settings.precision, self.optimizer_kind)
            for c in self.components
        }

    def to_dict(self) -> dict[str, Any]:
        expected = self.expected_bytes_per_param()
        return {
            "model": self.model,
            "model_class": self.model_class,
            "task": self.task.value,
            "settings": self.settings.to_dict(),
            "workload": self.workload.to_dict(),
            "parameter_count": self.parameter_count,
            "trainable_parameters": self.trainable_parameters,
            "components": {
                c.value: {
                    "bytes": v,
                    "label": c.label,
                    "source": self.sources[c].value,
                    "bytes_per_param": (v / self.parameter_count)
                    if v is not None and self.parameter_count
                    else None,
                    "guide_bytes_per_param": expected.get(c),
                }
                for c, v in self.components.items()
            },
            "at_peak": {c.value: v for c, v in self.at_peak.items()},
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase.value,
            "phase_peaks": {p.value: v for p, v in self.phase_peaks.items()},
            "kv_cache_bytes": self.kv_cache_bytes,
            "total_bytes": self.total_bytes,
            "gpu": {"name": self.gpu_name, "bytes": self.gpu_bytes, "source": self.gpu_source},
            "fits": self.fits,
            "spare_bytes": self.spare_bytes,
            "notes": list(self.notes),
            "warnings": list(self.warnings),
            "elapsed_s": round(self.elapsed_s, 3),
        }
