"""reconcile(): rows in Component order that add up to NVML's per-process figure (CUDA) or the peak (CPU)."""

from __future__ import annotations

from anatomy.protocol import CudaMemory, Hello, Snapshot
from anatomy.vocabulary import MODEL_COMPONENTS, OPTIONAL_COMPONENTS, Component
from tui.format import fmt_bytes
from tui.sources.reconcile import (
    PER_PARAMETER,
    TOTAL_NVML,
    TOTAL_PEAK,
    TOTAL_RESERVED,
    reconcile,
    total_line,
)

MIB = 1 << 20
PARAMS = 110_000_000


def hello(device: str) -> Hello:
    return Hello(
        pid=42,
        host="h",
        device=device,
        precision="fp16_mixed",
        optimizer="adamw",
        model_class="BertForMaskedLM",
        parameter_count=PARAMS,
        torch_version="2.13",
        started_at=0.0,
    )


def model_memory(unattributed: int | None = 3 * MIB) -> dict[str, int | None]:
    return {
        "weights": 6 * PARAMS,
        "optimizer_states": 8 * PARAMS,
        "gradients": 4 * PARAMS,
        "activations": 2_000 * MIB,
        "temporaries": 300 * MIB,
        "unattributed": unattributed,
    }


EXPECTED = {"weights": 6.0, "optimizer_states": 8.0, "gradients": 4.0, "activations": None}


def cuda_snapshot(memory: dict[str, int | None], reserved: int, allocated: int) -> Snapshot:
    return Snapshot(
        pid=42,
        seq=1,
        time=0.0,
        step=1,
        memory=memory,
        expected_bytes_per_param=dict(EXPECTED),
        parameter_count=PARAMS,
        peak_bytes=sum(v or 0 for v in memory.values()),
        cuda=CudaMemory(
            allocated=allocated, reserved=reserved, peak_allocated=allocated, alloc_retries=0, ooms=0
        ),
    )


def test_cuda_rows_sum_to_nvml() -> None:
    memory = model_memory()
    allocated = sum(v or 0 for v in memory.values())
    reserved = allocated + 512 * MIB
    nvml = reserved + 1300 * MIB
    memory["allocator_cache"] = reserved - allocated  # the hook's own measurement
    memory["cuda_context"] = None  # the hook cannot know it
    rec = reconcile(hello("cuda:0"), cuda_snapshot(memory, reserved, allocated), nvml)
    assert [r.component for r in rec.rows] == [c for c in Component if c not in OPTIONAL_COMPONENTS]
    assert rec.total == nvml and rec.total_source == TOTAL_NVML and rec.on_cuda
    assert rec.row(Component.CUDA_CONTEXT).bytes == 1300 * MIB
    assert rec.row(Component.ALLOCATOR_CACHE).bytes == 512 * MIB
    assert sum(r.bytes for r in rec.rows) == nvml
    assert rec.reconciles and rec.unexplained == 0 and rec.note is None
    assert abs(sum(r.share for r in rec.rows) - 1.0) < 1e-12
    weights = rec.row(Component.WEIGHTS)
    assert weights.bytes_per_param == 6.0 and weights.expected_bytes_per_param == 6.0
    assert weights.share == 6 * PARAMS / nvml
    assert rec.row(Component.ACTIVATIONS).expected_bytes_per_param is None
    assert rec.row(Component.TEMPORARIES).expected_bytes_per_param is None


def test_cuda_cache_from_allocator_when_hook_omits_it_and_gap_is_reported() -> None:
    memory = model_memory()
    model_sum = sum(v or 0 for v in memory.values())
    allocated = model_sum + 100 * MIB  # 100 MiB the hook does not attribute
    reserved = allocated + 256 * MIB
    nvml = reserved + 700 * MIB
    rec = reconcile(hello("cuda:0"), cuda_snapshot(memory, reserved, allocated), nvml)
    assert rec.row(Component.ALLOCATOR_CACHE).bytes == 256 * MIB  # reserved - allocated, not a plug
    assert rec.row(Component.CUDA_CONTEXT).bytes == 700 * MIB
    assert not rec.reconciles and rec.unexplained == 100 * MIB
    assert rec.note == "100.0 MiB of the total is not accounted for by any component"
    assert all(r.share <= 1 for r in rec.rows)


def test_cuda_without_nvml_figure_does_not_claim_to_reconcile() -> None:
    memory = model_memory()
    peak = sum(v or 0 for v in memory.values())
    rec = reconcile(hello("cuda:0"), cuda_snapshot(memory, peak + MIB, peak), None)
    assert rec.row(Component.CUDA_CONTEXT).bytes is None
    assert rec.row(Component.ALLOCATOR_CACHE).bytes == MIB
    assert rec.total == peak + MIB and rec.total_source == TOTAL_RESERVED
    assert not rec.reconciles and "NVML" in (rec.note or "")


def test_nvml_below_reserved_is_explained() -> None:
    memory = model_memory()
    peak = sum(v or 0 for v in memory.values())
    rec = reconcile(hello("cuda:0"), cuda_snapshot(memory, peak + MIB, peak), peak)
    assert rec.row(Component.CUDA_CONTEXT).bytes is None and not rec.reconciles
    assert "less" in (rec.note or "")


def test_cuda_with_unmeasured_component() -> None:
    memory = model_memory(unattributed=None)
    rec = reconcile(hello("cuda:0"), cuda_snapshot(memory, 9000 * MIB, 8000 * MIB), 10_000 * MIB)
    assert rec.row(Component.ALLOCATOR_CACHE).bytes == 1000 * MIB
    assert rec.row(Component.UNATTRIBUTED).bytes is None
    assert rec.row(Component.UNATTRIBUTED).share is None
    assert not rec.reconciles and rec.note == "unmeasured: Unattributed"


def test_cpu_rows_sum_to_peak_without_cuda_rows() -> None:
    memory = model_memory()
    peak = sum(v or 0 for v in memory.values())
    snap = Snapshot(
        pid=42,
        seq=1,
        time=0.0,
        step=1,
        memory=memory,
        expected_bytes_per_param=dict(EXPECTED),
        parameter_count=PARAMS,
        peak_bytes=peak,
    )
    rec = reconcile(hello("cpu"), snap, None)
    assert [r.component for r in rec.rows] == list(MODEL_COMPONENTS)
    assert rec.total == peak and rec.total_source == TOTAL_PEAK and not rec.on_cuda
    assert rec.reconciles
    for row in rec.rows:
        assert row.bytes == memory[row.component.value]
        expected = memory[row.component.value] / PARAMS if row.component in PER_PARAMETER else None
        assert row.bytes_per_param == expected
        assert row.share == memory[row.component.value] / peak
    # a peak that the rows do not reach is reported, not hidden
    rec2 = reconcile(hello("cpu"), Snapshot(**{**snap.__dict__, "peak_bytes": peak + 10}), None)
    assert not rec2.reconciles and rec2.unexplained == 10
    assert rec2.note == "10 B of the total is not accounted for by any component"


def test_components_that_do_not_coexist_keep_shares_below_one() -> None:
    memory = model_memory()
    rows_sum = sum(v or 0 for v in memory.values())
    peak = rows_sum - memory["activations"]  # e.g. a peak in the optimizer step, activations freed
    snap = Snapshot(
        pid=42,
        seq=1,
        time=0.0,
        step=1,
        memory=memory,
        expected_bytes_per_param={},
        parameter_count=PARAMS,
        peak_bytes=peak,
    )
    rec = reconcile(hello("cpu"), snap, None)
    assert not rec.reconciles and rec.total == peak and rec.unexplained == -memory["activations"]
    assert "more than the total" in (rec.note or "")
    assert max(r.share for r in rec.rows) < 1
    assert abs(sum(r.share for r in rec.rows) - 1.0) < 1e-12
    assert rec.row(Component.ACTIVATIONS).share == memory["activations"] / rows_sum


def test_zero_parameters_gives_no_bytes_per_param() -> None:
    snap = Snapshot(
        pid=1, seq=1, time=0.0, step=0, memory={"weights": 0}, expected_bytes_per_param={}, parameter_count=0
    )
    rec = reconcile(None, snap, None)
    assert all(r.bytes_per_param is None for r in rec.rows)
    assert rec.total == 0 and not rec.reconciles and rec.unexplained is None


# -- the split at the peak (Snapshot.at_peak) ---------------------------------------------------------


def at_peak_split() -> dict[str, int | None]:
    # held at a backward peak: a third of the activations already freed, the first gradients made
    return {
        "weights": 6 * PARAMS,
        "optimizer_states": 8 * PARAMS,
        "gradients": PARAMS,
        "activations": 1_300 * MIB + 17,
        "temporaries": 211 * MIB + 5,
        "unattributed": 3 * MIB,
    }


def at_peak_snapshot(cuda: CudaMemory | None, at_peak: dict[str, int | None] | None = None) -> Snapshot:
    split = at_peak_split() if at_peak is None else at_peak
    return Snapshot(
        pid=42,
        seq=1,
        time=0.0,
        step=7,
        memory=model_memory(),  # each component at its own maximum
        expected_bytes_per_param=dict(EXPECTED),
        parameter_count=PARAMS,
        peak_bytes=sum(v or 0 for v in split.values()),
        peak_phase="backward",
        cuda=cuda,
        at_peak=split,
        at_peak_step=5,
    )


def _cuda(peak: int, reserved: int) -> CudaMemory:
    return CudaMemory(allocated=peak // 2, reserved=reserved, peak_allocated=peak, alloc_retries=0, ooms=0)


def test_cpu_at_peak_rows_sum_to_the_peak_with_maxima_beside_them() -> None:
    snap = at_peak_snapshot(None)
    peak = snap.peak_bytes
    rec = reconcile(hello("cpu"), snap, None)
    assert rec.at_peak and rec.total == peak and rec.total_source == TOTAL_PEAK
    assert [r.component for r in rec.rows] == list(MODEL_COMPONENTS)
    assert sum(r.bytes or 0 for r in rec.rows) == peak and rec.reconciles and rec.unexplained == 0
    assert abs(sum(r.share or 0 for r in rec.rows) - 1.0) < 1e-12
    split, maxima = at_peak_split(), model_memory()
    for row in rec.rows:
        assert row.bytes == split[row.component.value]
        assert row.share == split[row.component.value] / peak
        assert row.max_bytes == maxima[row.component.value]
        per_param = maxima[row.component.value] / PARAMS  # of the maximum
        assert row.bytes_per_param == (per_param if row.component in PER_PARAMETER else None)
    assert rec.note is not None and "glibc heap" in rec.note  # what the total is, on CPU
    assert rec.peak_phase == "backward" and rec.at_peak_step == 5
    line = total_line(rec, 7)
    assert line == f"Peak {fmt_bytes(peak)} in backward = sum of the rows · split traced at step 5"


def test_cuda_at_peak_rows_sum_to_nvml() -> None:
    snap0 = at_peak_snapshot(None)
    peak = snap0.peak_bytes
    reserved = peak + 640 * MIB + 3
    nvml = reserved + 1300 * MIB + 11
    snap = at_peak_snapshot(_cuda(peak, reserved))
    rec = reconcile(hello("cuda:0"), snap, nvml)
    assert rec.at_peak and rec.total == nvml and rec.total_source == TOTAL_NVML and rec.on_cuda
    assert [r.component for r in rec.rows] == [c for c in Component if c not in OPTIONAL_COMPONENTS]
    assert rec.row(Component.CUDA_CONTEXT).bytes == nvml - reserved
    assert rec.row(Component.ALLOCATOR_CACHE).bytes == reserved - peak  # beyond the PEAK allocated
    assert sum(r.bytes or 0 for r in rec.rows) == nvml and rec.reconciles and rec.note is None
    assert abs(sum(r.share or 0 for r in rec.rows) - 1.0) < 1e-12
    model_rows = sum(rec.row(c).bytes or 0 for c in MODEL_COMPONENTS)
    assert model_rows == peak
    assert total_line(rec, 7).startswith(f"NVML {fmt_bytes(nvml)} = sum of the rows · peak allocated ")


def test_cuda_at_peak_without_nvml_totals_reserved_with_the_context_unmeasured() -> None:
    peak = at_peak_snapshot(None).peak_bytes
    reserved = peak + 5 * MIB
    rec = reconcile(hello("cuda:0"), at_peak_snapshot(_cuda(peak, reserved)), None)
    assert rec.total == reserved and rec.total_source == TOTAL_RESERVED
    assert rec.row(Component.CUDA_CONTEXT).bytes is None and rec.row(Component.CUDA_CONTEXT).share is None
    assert sum(r.bytes or 0 for r in rec.rows) == reserved and rec.reconciles
    assert "NVML" in (rec.note or "") and "unmeasured" in (rec.note or "")
    assert abs(sum(r.share or 0 for r in rec.rows) - 1.0) < 1e-12


def test_cuda_at_peak_with_reserved_below_the_peak_says_so() -> None:
    peak = at_peak_snapshot(None).peak_bytes
    rec = reconcile(hello("cuda:0"), at_peak_snapshot(_cuda(peak, peak - MIB)), peak + 900 * MIB)
    assert rec.row(Component.ALLOCATOR_CACHE).bytes is None and not rec.reconciles
    assert "less than the step's peak" in (rec.note or "")


def test_at_peak_with_an_unmeasured_component_does_not_claim_to_add_up() -> None:
    split = at_peak_split()
    split["activations"] = None
    rec = reconcile(hello("cpu"), at_peak_snapshot(None, split), None)
    assert rec.at_peak and not rec.reconciles and rec.note == "unmeasured: Activations"
    assert rec.row(Component.ACTIVATIONS).share is None


def test_optional_components_appear_only_when_the_hook_sends_them() -> None:
    split = at_peak_split()
    runtime, inputs = 150 * MIB + 1, 12 * MIB + 7
    with_optional = {**split, "runtime": runtime, "inputs": inputs}
    snap = Snapshot(
        pid=42,
        seq=1,
        time=0.0,
        step=7,
        memory={**model_memory(), "runtime": runtime, "inputs": inputs},
        expected_bytes_per_param=dict(EXPECTED),
        parameter_count=PARAMS,
        peak_bytes=sum(v or 0 for v in with_optional.values()),
        peak_phase="backward",
        at_peak=with_optional,
        at_peak_step=7,
    )
    rec = reconcile(hello("cpu"), snap, None)
    shown = [r.component for r in rec.rows]
    # In the vocabulary's order, the runtime before the weights, the inputs after the activations;
    # no row for FSDP's unsharded parameters or communication buffers, which this job does not have.
    assert shown == [c for c in Component if c in {*MODEL_COMPONENTS, Component.RUNTIME, Component.INPUTS}]
    assert shown.index(Component.RUNTIME) < shown.index(Component.WEIGHTS)
    assert shown.index(Component.ACTIVATIONS) < shown.index(Component.INPUTS)
    assert rec.row(Component.RUNTIME).bytes == runtime and rec.row(Component.INPUTS).bytes == inputs
    assert rec.reconciles and sum(r.bytes or 0 for r in rec.rows) == snap.peak_bytes
    assert rec.row(Component.UNSHARDED_PARAMETERS) is None
    assert rec.row(Component.COMMUNICATION_BUFFERS) is None


def test_bytes_per_param_only_for_components_that_grow_with_the_model() -> None:
    """Unattributed memory, the CUDA context and the allocator cache are not per parameter: no B/param
    (the guide has none either), so the column never suggests they scale with the model."""
    memory = model_memory()
    snap = Snapshot(
        pid=42,
        seq=1,
        time=0.0,
        step=1,
        memory=memory,
        expected_bytes_per_param=dict(EXPECTED),
        parameter_count=PARAMS,
        peak_bytes=sum(v or 0 for v in memory.values()),
    )
    rec = reconcile(hello("cpu"), snap, None)
    unattributed = rec.row(Component.UNATTRIBUTED)
    assert unattributed is not None and unattributed.bytes and unattributed.bytes_per_param is None
    weights = rec.row(Component.WEIGHTS)
    assert weights is not None and weights.bytes_per_param == memory["weights"] / PARAMS
    assert Component.CUDA_CONTEXT not in PER_PARAMETER and Component.ALLOCATOR_CACHE not in PER_PARAMETER
