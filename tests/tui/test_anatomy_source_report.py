"""The --once anatomy text and the JSON `training` entries, from hand-built processes."""

from __future__ import annotations

import dataclasses
import json

from anatomy import protocol
from anatomy.protocol import CudaMemory, Hello, OpGroupStat, Snapshot, Suggestion, Timing
from anatomy.vocabulary import OPTIONAL_COMPONENTS, Component, OpGroup, PublisherState
from tui import format as fmt
from tui.report.anatomy_json import training_json
from tui.report.anatomy_text import render_training_text
from tui.sources.anatomy_source import TrainingProcess, rank_group_key
from tui.sources.model import GpuProcess, MachineSnapshot, NvmlStatus

MIB = 1 << 20
PARAMS = 4_385_920


def hello(device: str = "cpu", model_class: str = "BertForSequenceClassification") -> Hello:
    return Hello(
        pid=4242,
        host="box",
        device=device,
        precision="fp32",
        optimizer="adamw",
        model_class=model_class,
        parameter_count=PARAMS,
        torch_version="2.13",
        started_at=0.0,
        optimizer_class="AdamW",
    )


def snapshot(cuda: CudaMemory | None = None, oom: str | None = None) -> Snapshot:
    memory = {
        "weights": 4 * PARAMS + 8192,
        "optimizer_states": 8 * PARAMS + 1608,
        "gradients": 4 * PARAMS,
        "activations": 23 * MIB + 77,
        "temporaries": 3 * MIB,
        "unattributed": 123_456,
    }
    return Snapshot(
        pid=4242,
        seq=12,
        time=1.0,
        step=12,
        memory=memory,
        expected_bytes_per_param={"weights": 4.0, "optimizer_states": 8.0, "gradients": 4.0},
        parameter_count=PARAMS,
        peak_bytes=sum(memory.values()),
        peak_phase="backward",
        cuda=cuda,
        timing=Timing(
            step_s=0.25,
            forward_s=0.08,
            backward_s=0.15,
            optimizer_s=0.02,
            samples_per_s=32.0,
            tokens_per_s=2048.0,
        ),
        op_groups={
            OpGroup.CONTRACTION.value: OpGroupStat(flops=9.9e9, time_s=0.12),
            OpGroup.NORMALIZATION.value: OpGroupStat(flops=2e7, time_s=0.01),
            OpGroup.ELEMENTWISE.value: OpGroupStat(flops=8e7, time_s=0.05),
            OpGroup.OTHER.value: OpGroupStat(flops=0.0, time_s=0.02),
        },
        op_groups_step=10,
        suggestions=[
            Suggestion(
                rule="grad_ckpt",
                title="Enable gradient checkpointing",
                detail="model.gradient_checkpointing_enable()",
                source="measured",
                saving_bytes=20 * MIB,
                speed_factor=0.8,
            )
        ],
        oom=oom,
    )


def process(
    h: Hello, s: Snapshot | None, state: PublisherState = PublisherState.LIVE, oom: str | None = None
) -> TrainingProcess:
    return TrainingProcess(
        pid=h.pid,
        hello=h,
        snapshot=s,
        state=state,
        oom=oom,
        rank_group=rank_group_key(h),
        memory_history=(1, 2),
    )


def machine_with(pid: int, gpu_memory: int) -> MachineSnapshot:
    procs = (
        GpuProcess(gpu_index=1, pid=pid, type="C", gpu_memory=300 * MIB),  # a stray context elsewhere
        GpuProcess(gpu_index=0, pid=pid, type="C", gpu_memory=gpu_memory),
        GpuProcess(gpu_index=0, pid=pid + 1, type="C", gpu_memory=10 * gpu_memory),
    )
    return MachineSnapshot(time=0.0, nvml=NvmlStatus(available=True), processes=procs)


def test_text_shows_components_step_op_groups_and_suggestions() -> None:
    snap = snapshot()
    text = render_training_text([process(hello(), snap)])
    lines = text.splitlines()
    assert "Training process 4242" in lines[1] and "[live]" in lines[1] and "step 12" in lines[1]
    for comp in (Component.WEIGHTS, Component.ACTIVATIONS, Component.UNATTRIBUTED):
        value = snap.memory[comp.value]
        row = next(ln for ln in lines if ln.strip().startswith(comp.label))
        assert fmt.fmt_bytes(value) in row
        assert fmt.fmt_share(value / snap.peak_bytes) in row
        if comp is Component.UNATTRIBUTED:  # not per parameter: a dash, no figure
            assert row.split()[-2:] == ["-", "-"]
        else:
            assert fmt.fmt_bytes_per_param(value / PARAMS) in row
    assert "CUDA" not in text  # no CUDA rows on CPU
    assert "components add up exactly" in text
    total_flops = 9.9e9 + 2e7 + 8e7
    contraction = next(ln for ln in lines if ln.strip().startswith("Tensor contractions"))
    assert fmt.fmt_share(9.9e9 / total_flops) in contraction and fmt.fmt_share(0.12 / 0.2) in contraction
    assert "sampled on step 10" in text
    assert f"Step: {fmt.fmt_seconds(0.25)}" in text and "forward 80 ms (32%)" in text
    assert fmt.fmt_rate(2048.0, "tokens") in text
    assert "1. Enable gradient checkpointing (saves 20.0 MiB, speed x0.80, measured)" in text


def test_text_marks_oom_and_neutralises_control_characters() -> None:
    evil = "Bert\x1b[2J\x1b]0;pwned\x07"
    snap = snapshot(oom="CUDA out of memory. Tried to allocate 2.00 GiB")
    oomed = process(hello(model_class=evil), snap, state=PublisherState.OOM, oom=snap.oom)
    text = render_training_text([oomed])
    assert "OUT OF MEMORY: CUDA out of memory. Tried to allocate 2.00 GiB" in text
    assert "[oom]" in text
    assert "\x1b" not in text and "\x07" not in text and "Bert\\x1b[2J\\x1b]0;pwned\\x07" in text


def test_text_of_waiting_process_and_empty_list() -> None:
    assert render_training_text([]) == ""
    text = render_training_text([process(hello(), None)])
    assert "Waiting for the first snapshot" in text


def test_cuda_reconciles_against_the_machines_nvml_figure() -> None:
    snap0 = snapshot()
    model_sum = sum(v for v in snap0.memory.values() if v is not None)
    reserved = model_sum + 64 * MIB
    cuda = CudaMemory(
        allocated=model_sum, reserved=reserved, peak_allocated=model_sum, alloc_retries=0, ooms=0
    )
    snap = snapshot(cuda=cuda)
    nvml = reserved + 500 * MIB
    proc = process(hello("cuda:0"), snap)
    machine = machine_with(4242, nvml)
    text = render_training_text([proc], machine)
    context = next(ln for ln in text.splitlines() if "CUDA context" in ln)
    assert fmt.fmt_bytes(500 * MIB) in context
    cache = next(ln for ln in text.splitlines() if "Allocator cache" in ln)
    assert fmt.fmt_bytes(64 * MIB) in cache
    assert f"NVML per-process memory {fmt.fmt_bytes(nvml)}" in text and "add up exactly" in text

    (entry,) = training_json([proc], machine)
    doc = json.loads(json.dumps(entry, allow_nan=False))
    assert doc["nvml_process_bytes"] == nvml
    assert protocol.from_dict(doc["hello"]) == proc.hello
    assert protocol.from_dict(doc["snapshot"]) == snap
    rec = doc["reconciled"]
    assert rec["reconciles"] and rec["total"] == nvml and rec["total_source"] == "nvml"
    assert [r["component"] for r in rec["rows"]] == [
        c.value for c in Component if c not in OPTIONAL_COMPONENTS
    ]
    assert sum(r["bytes"] for r in rec["rows"]) == nvml
    assert doc["state"] == "live" and doc["memory_history"] == [1, 2]
    assert doc["rank_group"] == "box|1|BertForSequenceClassification"


def test_json_of_process_without_snapshot() -> None:
    (entry,) = training_json([process(hello(), None, state=PublisherState.ERROR)])
    assert entry["snapshot"] is None and entry["reconciled"] is None and entry["state"] == "error"
    json.dumps(entry, allow_nan=False)


def with_split(snap: Snapshot, cuda: CudaMemory | None = None) -> Snapshot:
    """The same step as the hook now sends it: the split at the peak next to each component's maximum."""
    split = dict(snap.memory)
    split["activations"] = 11 * MIB + 5  # a backward peak: part of the activations already freed
    split["gradients"] = 2 * MIB
    return dataclasses.replace(
        snap, at_peak=split, peak_bytes=sum(split.values()), at_peak_step=10, cuda=cuda
    )


def test_text_and_json_of_the_split_at_the_peak() -> None:
    snap = with_split(snapshot())
    peak = snap.peak_bytes
    assert snap.at_peak is not None and peak is not None
    text = render_training_text([process(hello(), snap)])
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.strip().startswith("Component"))
    assert header.split() == ["Component", "At", "peak", "Share", "Max", "in", "step", "B/param", "Guide"]
    assert f"Memory: Peak {fmt.fmt_bytes(peak)} in backward = sum of the rows" in text
    assert "split traced at step 10" in text and "glibc heap" in text
    for comp in (Component.WEIGHTS, Component.GRADIENTS, Component.ACTIVATIONS):
        row = next(ln for ln in lines if ln.strip().startswith(comp.label)).split()
        held, maximum = snap.at_peak[comp.value], snap.memory[comp.value]
        assert fmt.fmt_bytes(held) in " ".join(row[:-4])  # the At peak column, before the share
        assert fmt.fmt_share(held / peak) in row
        assert fmt.fmt_bytes(maximum) in " ".join(row)
        assert fmt.fmt_bytes_per_param(maximum / PARAMS) in row  # bytes/param of the maximum
    (entry,) = training_json([process(hello(), snap)])
    rec = json.loads(json.dumps(entry, allow_nan=False))["reconciled"]
    assert rec["at_peak"] and rec["reconciles"] and rec["total"] == peak and rec["at_peak_step"] == 10
    assert sum(r["bytes"] for r in rec["rows"]) == peak
    assert abs(sum(r["share"] for r in rec["rows"]) - 1.0) < 1e-12
    assert {r["component"]: r["max_bytes"] for r in rec["rows"]} == snap.memory


def test_cuda_split_at_the_peak_adds_up_to_nvml_in_text_and_json() -> None:
    peak = with_split(snapshot()).peak_bytes
    assert peak is not None
    reserved, nvml = peak + 64 * MIB, peak + 64 * MIB + 700 * MIB
    cuda = CudaMemory(allocated=peak // 3, reserved=reserved, peak_allocated=peak, alloc_retries=0, ooms=0)
    snap = with_split(snapshot(), cuda)
    proc = process(hello("cuda:0"), snap)
    machine = machine_with(4242, nvml)
    text = render_training_text([proc], machine)
    assert f"NVML {fmt.fmt_bytes(nvml)} = sum of the rows · peak allocated {fmt.fmt_bytes(peak)}" in text
    cache = next(ln for ln in text.splitlines() if "Allocator cache" in ln)
    assert fmt.fmt_bytes(64 * MIB) in cache  # reserved − peak allocated
    (entry,) = training_json([proc], machine)
    rec = entry["reconciled"]
    assert rec["reconciles"] and rec["total_source"] == "nvml"
    assert sum(r["bytes"] for r in rec["rows"]) == nvml
