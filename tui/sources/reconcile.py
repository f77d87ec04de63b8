"""Reconcile the hook's memory anatomy with what NVML reports for the same process.

When the hook sends ``Snapshot.at_peak`` (what each component held at the moment of the step's peak),
the rows are that split, and they add up exactly:

    CUDA:  NVML bytes = CUDA context + kernels      (= NVML bytes − reserved − managed)
                      + managed memory              (bitsandbytes' paged optimizer states, outside the
                                                     allocator: ``CudaMemory.managed``, not a row)
                      + allocator cache             (= reserved − peak allocated)
                      + the at-peak rows            (sum = peak allocated: weights, optimizer states,
                                                     gradients, activations, temporaries, unattributed)
    CPU:   peak = the at-peak rows                  (glibc heap in use at the step's peak)

Each row also carries ``max_bytes``, the component at its own maximum in the step (``Snapshot.memory``):
gradients at their peak, activations at theirs — the figure for the Max column and bytes/param. The
bar and the shares use the at-peak bytes, so the shares sum to 100%.

An older hook (no ``at_peak``) gets the former view: each component at its own maximum, checked
against the total, the difference reported (``unexplained``, ``note``), never hidden in a plug figure.
Without NVML's figure (CUDA) the total is the allocator's reserved bytes and the CUDA context is
unmeasured.

Stdlib only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from anatomy.protocol import Hello, Snapshot
from anatomy.vocabulary import MODEL_COMPONENTS, OPTIONAL_COMPONENTS, Component
from tui.format import fmt_bytes
from tui.sources.model import GpuProcess

CUDA_COMPONENTS: tuple[Component, ...] = (Component.CUDA_CONTEXT, Component.ALLOCATOR_CACHE)
# Components that grow with the parameter count, for which bytes per parameter means something (the
# guide's figures are per parameter too); the others (CUDA context, allocator cache, runtime, inputs,
# unattributed) get no bytes/param.
# Gradients and optimizer states exist only for trained parameters: per *trainable* parameter (a LoRA
# adapter's few), the others per parameter of the whole model.
PER_TRAINABLE: frozenset[Component] = frozenset({Component.OPTIMIZER_STATES, Component.GRADIENTS})
PER_PARAMETER: frozenset[Component] = frozenset(
    {
        Component.WEIGHTS,
        Component.UNSHARDED_PARAMETERS,
        Component.OPTIMIZER_STATES,
        Component.GRADIENTS,
        Component.ACTIVATIONS,
        Component.COMMUNICATION_BUFFERS,
        Component.TEMPORARIES,
    }
)

TOTAL_NVML = "nvml"  # the total is NVML's per-process GPU memory
TOTAL_RESERVED = "reserved"  # CUDA, NVML figure unknown: the total is what the allocator reserved
TOTAL_PEAK = "peak"  # CPU: the step's measured peak
TOTAL_SUM = "sum"  # nothing to check against: the sum of what was measured


@dataclass(frozen=True)
class ReconciledRow:
    component: Component
    bytes: int | None  # held at the step's peak (its own maximum for an older hook); None: unmeasured
    share: float | None  # of Reconciled.total, 0..1
    bytes_per_param: float | None  # of max_bytes
    expected_bytes_per_param: float | None  # the guide's figure for this set-up; None: no guide figure
    max_bytes: int | None = None  # the component at its own maximum in the step

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
    note: str | None = None  # why it does not reconcile (or, on CPU, what the total is), in words
    trainable_parameter_count: int | None = None  # None: an older hook (every parameter trains)
    at_peak: bool = False  # rows are the split at the peak (else each component at its own maximum)
    peak_bytes: int | None = None  # the step's peak: allocated (CUDA) / glibc heap in use (CPU)
    peak_phase: str | None = None
    at_peak_step: int | None = None  # the step whose per-op trace gave the split
    managed_bytes: int = 0  # CUDA managed memory (paged optimizer states) taken out of NVML's figure

    @property
    def accounted(self) -> int:
        """The rows and the managed memory: what ``total`` is checked against."""
        return self.measured_sum + self.managed_bytes

    def row(self, component: Component) -> ReconciledRow | None:
        return next((r for r in self.rows if r.component is component), None)

    @property
    def unexplained(self) -> int | None:
        """total − the rows − managed memory: what nothing accounts for (negative when they overshoot)."""
        return None if self.total_source == TOTAL_SUM else self.total - self.accounted


SUM_OF_ROWS = " = sum of the rows"
CPU_TOTAL_NOTE = "on CPU the total is the glibc heap in use at the step's peak"


def reconcile(hello: Hello | None, snapshot: Snapshot, nvml_process_bytes: int | None) -> Reconciled:
    """Rows per component with bytes at the peak, share of the total, the component's own maximum,
    bytes/param and the guide's bytes/param."""
    device = hello.device if hello is not None else ""
    on_cuda = snapshot.cuda is not None or device.startswith("cuda")
    params = snapshot.parameter_count or (hello.parameter_count if hello is not None else 0)
    trainable = snapshot.trainable_parameter_count
    if trainable is None and hello is not None:
        trainable = hello.trainable_parameter_count
    if snapshot.at_peak is not None and snapshot.peak_bytes is not None:
        return _reconcile_at_peak(snapshot, nvml_process_bytes, on_cuda, params, trainable)
    values: dict[Component, int | None] = {c: snapshot.memory.get(c) for c in Component}
    note: str | None = None

    if on_cuda:
        cuda = snapshot.cuda
        reserved = cuda.reserved if cuda is not None else None
        cache = snapshot.memory.get(Component.ALLOCATOR_CACHE)
        if cache is None and cuda is not None and cuda.reserved >= cuda.allocated:
            cache = cuda.reserved - cuda.allocated
        context = snapshot.memory.get(Component.CUDA_CONTEXT)
        measured_context, managed = _context_and_managed(
            nvml_process_bytes, reserved, cuda.managed if cuda is not None else 0
        )
        if measured_context is not None:
            context = measured_context
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
        order = _order(on_cuda, values)
    else:
        if snapshot.peak_bytes is not None:
            total, total_source = snapshot.peak_bytes, TOTAL_PEAK
        else:
            total, total_source = None, TOTAL_SUM
        order = _order(on_cuda, values)

    if not on_cuda:
        managed = 0
    measured_sum = sum(values[c] or 0 for c in order)
    all_measured = all(values[c] is not None for c in order)
    reconciles = total is not None and all_measured and measured_sum + managed == total
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
                bytes_per_param=_row_per_param(c, value, params, trainable),
                expected_bytes_per_param=snapshot.expected_bytes_per_param.get(c),
                max_bytes=value,
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
        trainable_parameter_count=trainable,
        peak_bytes=snapshot.peak_bytes,
        peak_phase=snapshot.peak_phase,
        managed_bytes=managed,
    )


def _reconcile_at_peak(
    snapshot: Snapshot, nvml_process_bytes: int | None, on_cuda: bool, params: int, trainable: int | None
) -> Reconciled:
    at_peak = snapshot.at_peak or {}
    peak = snapshot.peak_bytes or 0
    values: dict[Component, int | None] = {c: at_peak.get(c) for c in Component}
    maxima: dict[Component, int | None] = {c: snapshot.memory.get(c) for c in Component}
    note: str | None = None
    managed = 0
    skip: set[Component] = set()  # rows that cannot be measured in this situation (not a failure)
    if on_cuda:
        cuda = snapshot.cuda
        reserved = cuda.reserved if cuda is not None else None
        cache = None
        if reserved is not None and reserved >= peak:
            cache = reserved - peak
        context, managed = _context_and_managed(
            nvml_process_bytes, reserved, cuda.managed if cuda is not None else 0
        )
        values[Component.CUDA_CONTEXT] = maxima[Component.CUDA_CONTEXT] = context
        values[Component.ALLOCATOR_CACHE] = maxima[Component.ALLOCATOR_CACHE] = cache
        total: int
        if nvml_process_bytes is not None:
            total, total_source = nvml_process_bytes, TOTAL_NVML
        elif reserved is not None:
            total, total_source = reserved, TOTAL_RESERVED
            skip.add(Component.CUDA_CONTEXT)
            note = (
                "NVML's per-process memory is not available: the total is the allocator's reserved bytes; "
                "the CUDA context is unmeasured"
            )
        else:
            total, total_source = peak, TOTAL_PEAK
            skip.update(CUDA_COMPONENTS)
            note = "the hook sent no CUDA allocator figures: the total is the peak allocated"
        if reserved is not None and reserved < peak:
            note = "the allocator reserves less than the step's peak allocated (its cache was emptied)"
        if reserved is not None and nvml_process_bytes is not None and nvml_process_bytes < reserved:
            note = "NVML reports less for this process than its allocator reserved"
    else:
        total, total_source = peak, TOTAL_PEAK
        note = CPU_TOTAL_NOTE
    order = _order(on_cuda, values, maxima)
    measured_sum = sum(values[c] or 0 for c in order)
    all_measured = all(values[c] is not None for c in order if c not in skip)
    reconciles = all_measured and measured_sum + managed == total
    if not reconciles and (note is None or note == CPU_TOTAL_NOTE):
        missing = [c.label for c in order if values[c] is None and c not in skip]
        if missing:
            note = "unmeasured: " + ", ".join(missing)
        elif measured_sum > total:
            note = f"the rows sum to {fmt_bytes(measured_sum)}, more than the total {fmt_bytes(total)}"
        else:
            note = f"{fmt_bytes(total - measured_sum)} of the total is not accounted for by any component"
    denominator = max(total, measured_sum)
    rows = tuple(
        ReconciledRow(
            component=c,
            bytes=values[c],
            share=_fraction(values[c], denominator),
            bytes_per_param=_row_per_param(c, maxima[c], params, trainable),
            expected_bytes_per_param=snapshot.expected_bytes_per_param.get(c),
            max_bytes=maxima[c],
        )
        for c in order
    )
    return Reconciled(
        rows=rows,
        total=total,
        total_source=total_source,
        measured_sum=measured_sum,
        reconciles=reconciles,
        parameter_count=params,
        on_cuda=on_cuda,
        note=note,
        trainable_parameter_count=trainable,
        at_peak=True,
        peak_bytes=snapshot.peak_bytes,
        peak_phase=snapshot.peak_phase,
        at_peak_step=snapshot.at_peak_step,
        managed_bytes=managed,
    )


def _context_and_managed(nvml: int | None, reserved: int | None, managed: int) -> tuple[int | None, int]:
    """CUDA context = NVML's figure − reserved − the managed memory in it. Managed pages count in NVML's
    figure only while resident on the GPU, so no more is taken out than NVML's figure leaves."""
    if nvml is None or reserved is None or nvml < reserved:
        return None, 0
    taken = min(max(managed, 0), nvml - reserved)
    return nvml - reserved - taken, taken


def _order(on_cuda: bool, *figures: dict[Component, int | None]) -> tuple[Component, ...]:
    """The rows to show, in the vocabulary's order: the CUDA rows on CUDA, the guide's components always,
    an optional component (runtime, unsharded parameters, inputs, communication buffers) only when the hook
    sent a figure for it."""
    shown = set(MODEL_COMPONENTS)
    if on_cuda:
        shown.update(CUDA_COMPONENTS)
    shown.update(c for c in OPTIONAL_COMPONENTS if any(f.get(c) is not None for f in figures))
    return tuple(c for c in Component if c in shown)


def _fraction(value: int | None, denominator: int) -> float | None:
    return value / denominator if value is not None and denominator > 0 else None


def _row_per_param(c: Component, value: int | None, params: int, trainable: int | None) -> float | None:
    if c not in PER_PARAMETER:
        return None
    return _per_param(value, trainable if c in PER_TRAINABLE and trainable is not None else params)


def _per_param(value: int | None, params: int) -> float | None:
    return value / params if value is not None and params > 0 else None


def total_line(rec: Reconciled, step: int | None = None) -> str:
    """The pane's total line: "Peak 96.8 MiB in optimizer = sum of the rows" (CPU), with NVML's figure
    first on CUDA ("NVML 14.6 GiB = sum of the rows · peak allocated 12.1 GiB in backward")."""
    phase = f" in {rec.peak_phase}" if rec.peak_phase else ""
    peak = f"{fmt_bytes(rec.peak_bytes)}{phase}"
    equals = SUM_OF_ROWS if rec.reconciles else ""
    if rec.managed_bytes and rec.reconciles:
        equals = f" = sum of the rows + {fmt_bytes(rec.managed_bytes)} paged optimizer states (managed)"
    if rec.total_source == TOTAL_NVML:
        line = f"NVML {fmt_bytes(rec.total)}{equals} · peak allocated {peak}"
    elif rec.total_source == TOTAL_RESERVED:
        line = f"Reserved {fmt_bytes(rec.total)}{equals} · peak allocated {peak}"
    else:
        line = f"Peak {peak}{equals}"
    if rec.at_peak_step is not None and step is not None and rec.at_peak_step != step:
        line += f" · split traced at step {rec.at_peak_step}"
    return line


def nvml_process_bytes(pid: int, processes: Iterable[GpuProcess]) -> int | None:
    """NVML's memory figure for ``pid`` on the GPU it trains on. A process can also hold a small context
    on other GPUs (a stray ``torch.cuda`` call on device 0); the hook's allocator figures describe one
    device, so the largest entry is the one to reconcile against."""
    sizes = [p.gpu_memory for p in processes if p.pid == pid and p.gpu_memory is not None]
    return max(sizes) if sizes else None
