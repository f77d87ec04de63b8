"""Reconcile the hook's memory anatomy with what NVML reports for the same process.

On CUDA, NVML's per-process figure is everything the process holds on the GPU:

    NVML bytes = CUDA context + kernels            (= NVML bytes − reserved)
               + allocator cache                   (= reserved − allocated)
               + allocated                         (what the model components hold)

CUDA context and allocator cache are derived from measured figures (NVML's, and the caching
allocator's). The model components (weights, optimizer states, gradients, activations, temporaries,
unattributed) are the hook's. ``reconciles`` says whether the rows add up exactly to the total — NVML's
figure on CUDA, the step's measured peak on CPU (where the CUDA rows are left out). When they do not,
the difference is reported (``unexplained``, ``note``), never hidden in a plug figure: the hook measures
each component at its own high point, and activations (freed by the end of backward) and optimizer
states (grown in the optimizer step) need not coexist, so the rows can sum to more than the peak.

Shares are fractions of the larger of the total and the rows' sum, so no share exceeds 100%.

Stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from anatomy.protocol import Hello, Snapshot
from anatomy.vocabulary import MODEL_COMPONENTS, Component
from tui.format import fmt_bytes
from tui.sources.model import GpuProcess

CUDA_COMPONENTS: tuple[Component, ...] = (Component.CUDA_CONTEXT, Component.ALLOCATOR_CACHE)

TOTAL_NVML = "nvml"  # the total is NVML's per-process GPU memory
TOTAL_RESERVED = "reserved"  # CUDA, NVML figure unknown: the total is what the allocator reserved
TOTAL_PEAK = "peak"  # CPU: the step's measured peak
TOTAL_SUM = "sum"  # nothing to check against: the sum of what was measured


@dataclass(frozen=True)
class ReconciledRow:
    component: Component
    bytes: int | None  # None: unmeasured
    share: float | None  # of Reconciled.total, 0..1
    bytes_per_param: float | None
    expected_bytes_per_param: float | None  # the guide's figure for this set-up; None: no guide figure

    @property
    def label(self) -> str:
        return self.component.label


@dataclass(frozen=True)
class Reconciled:
    rows: tuple[ReconciledRow, ...]  # in Component order
    total: int  # what the rows are checked against (see total_source; the rows' sum for TOTAL_SUM)
    total_source: str  # TOTAL_NVML | TOTAL_RESERVED | TOTAL_PEAK | TOTAL_SUM
    measured_sum: int  # the sum of the rows that have bytes
    reconciles: bool  # every row measured and they sum exactly to ``total``
    parameter_count: int
    on_cuda: bool
    note: str | None = None  # why it does not reconcile, in words

    def row(self, component: Component) -> ReconciledRow | None:
        return next((r for r in self.rows if r.component is component), None)

    @property
    def unexplained(self) -> int | None:
        """total − measured_sum: what no row accounts for (negative when the rows overshoot)."""
        return None if self.total_source == TOTAL_SUM else self.total - self.measured_sum


def reconcile(hello: Hello | None, snapshot: Snapshot, nvml_process_bytes: int | None) -> Reconciled:
    """Rows per component with bytes, share of the total, bytes/param and the guide's bytes/param."""
    device = hello.device if hello is not None else ""
    on_cuda = snapshot.cuda is not None or device.startswith("cuda")
    params = snapshot.parameter_count or (hello.parameter_count if hello is not None else 0)
    values: dict[Component, int | None] = {c: snapshot.memory.get(c.value) for c in MODEL_COMPONENTS}
    note: str | None = None

    if on_cuda:
        cuda = snapshot.cuda
        reserved = cuda.reserved if cuda is not None else None
        cache = snapshot.memory.get(Component.ALLOCATOR_CACHE.value)
        if cache is None and cuda is not None and cuda.reserved >= cuda.allocated:
            cache = cuda.reserved - cuda.allocated
        context = snapshot.memory.get(Component.CUDA_CONTEXT.value)
        if nvml_process_bytes is not None and reserved is not None and nvml_process_bytes >= reserved:
            context = nvml_process_bytes - reserved
        values[Component.CUDA_CONTEXT] = context
        values[Component.ALLOCATOR_CACHE] = cache
        total: int | None
        if nvml_process_bytes is not None:
            total, total_source = nvml_process_bytes, TOTAL_NVML
        elif reserved is not None:
            total, total_source = reserved, TOTAL_RESERVED
            note = "NVML's per-process memory is not available: the total is the allocator's reserved bytes"
        else:
            total, total_source = None, TOTAL_SUM
            note = "the hook sent no CUDA allocator figures"
        if reserved is not None and nvml_process_bytes is not None and nvml_process_bytes < reserved:
            note = "NVML reports less for this process than its allocator reserved"
        order: tuple[Component, ...] = (*CUDA_COMPONENTS, *MODEL_COMPONENTS)
    else:
        if snapshot.peak_bytes is not None:
            total, total_source = snapshot.peak_bytes, TOTAL_PEAK
        else:
            total, total_source = None, TOTAL_SUM
        order = MODEL_COMPONENTS

    measured_sum = sum(values[c] or 0 for c in order)
    all_measured = all(values[c] is not None for c in order)
    reconciles = total is not None and all_measured and measured_sum == total
    if total is None:
        total = measured_sum
    if not reconciles and note is None:
        missing = [c.label for c in order if values[c] is None]
        if total_source == TOTAL_SUM:
            note = "nothing to check the rows against"
        elif measured_sum > total:
            note = (
                f"the components sum to {fmt_bytes(measured_sum)}, more than the total {fmt_bytes(total)}: "
                "each is measured at its own high point and not all are held at once"
            )
        elif missing:
            note = "unmeasured: " + ", ".join(missing)
        else:
            note = f"{fmt_bytes(total - measured_sum)} of the total is not accounted for by any component"

    denominator = max(total, measured_sum)
    rows: list[ReconciledRow] = []
    for c in order:
        value = values[c]
        rows.append(
            ReconciledRow(
                component=c,
                bytes=value,
                share=value / denominator if value is not None and denominator > 0 else None,
                bytes_per_param=value / params if value is not None and params > 0 else None,
                expected_bytes_per_param=snapshot.expected_bytes_per_param.get(c.value),
            )
        )
    return Reconciled(
        rows=tuple(rows),
        total=total,
        total_source=total_source,
        measured_sum=measured_sum,
        reconciles=reconciles,
        parameter_count=params,
        on_cuda=on_cuda,
        note=note,
    )


def nvml_process_bytes(pid: int, processes: Iterable[GpuProcess]) -> int | None:
    """NVML's memory figure for ``pid`` on the GPU it trains on. A process can also hold a small context
    on other GPUs (a stray ``torch.cuda`` call on device 0); the hook's allocator figures describe one
    device, so the largest entry is the one to reconcile against."""
    sizes = [p.gpu_memory for p in processes if p.pid == pid and p.gpu_memory is not None]
    return max(sizes) if sizes else None
