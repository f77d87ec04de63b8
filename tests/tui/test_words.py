"""The anatomy pane's words: one figure per meaning, a saving said once, GPU memory vs the peak
explained in one line, the memory history on the same figure as the table."""

from __future__ import annotations

import frozen

from anatomy.protocol import Suggestion
from anatomy.vocabulary import Source
from tui import format as fmt
from tui.sources.anatomy_source import measured_total
from tui.sources.reconcile import reconcile
from tui.view.anatomy_text import gpu_memory_line, reconcile_note, suggestion_text


def test_a_saving_is_said_once_and_marked_as_an_estimate_unless_measured() -> None:
    predicted = Suggestion("r", "Gradient checkpointing", "d", Source.PREDICTED.value, saving_bytes=25 << 20)
    measured = Suggestion("leak", "Memory grows", "d", Source.MEASURED.value, saving_bytes=8 << 20)
    text = suggestion_text([predicted, measured]).plain
    assert text.count(fmt.fmt_bytes(25 << 20)) == 1 and f"saves ~{fmt.fmt_bytes(25 << 20)}" in text
    assert f"saves {fmt.fmt_bytes(8 << 20)}" in text


def test_gpu_memory_against_the_peak_in_one_line() -> None:
    cuda_job = frozen.training()[0]
    assert cuda_job.snapshot is not None
    rec = reconcile(cuda_job.hello, cuda_job.snapshot, frozen.NVML_TRAIN_BYTES)
    line = gpu_memory_line(rec, frozen.NVML_TRAIN_BYTES, "cuda:0")
    assert line is not None and "\n" not in line.plain
    assert "CUDA context" in line.plain and "allocator cache" in line.plain
    cpu_job = frozen.cpu_training()
    assert cpu_job.snapshot is not None
    cpu_rec = reconcile(cpu_job.hello, cpu_job.snapshot, None)
    cpu_line = gpu_memory_line(cpu_rec, 2 << 30, "cpu")
    assert cpu_line is not None and "2.00 GiB" in cpu_line.plain and "trains on cpu" in cpu_line.plain
    assert gpu_memory_line(cpu_rec, None, "cpu") is None  # nothing on a GPU: nothing to explain


def test_the_total_line_is_split_to_fit_the_pane() -> None:
    job = frozen.training()[0]
    assert job.snapshot is not None and job.snapshot.at_peak_step not in (None, job.snapshot.step)
    rec = reconcile(job.hello, job.snapshot, frozen.NVML_TRAIN_BYTES)
    lines = reconcile_note(rec, job.snapshot.step).plain.split("\n")
    assert lines[0] == f"NVML {fmt.fmt_bytes(frozen.NVML_TRAIN_BYTES)} = sum of the rows ✓"
    assert lines[1].startswith("peak allocated ") and lines[1].endswith(
        f" · split traced at step {job.snapshot.at_peak_step}"
    )
    assert all(len(line) <= 70 for line in lines)  # the anatomy pane side by side at 160 columns


def test_memory_history_is_the_peak_the_rows_add_up_to() -> None:
    job = frozen.training()[0]
    snap = job.snapshot
    assert snap is not None and snap.peak_bytes is not None and snap.at_peak is not None
    assert measured_total(snap) == snap.peak_bytes == sum(v or 0 for v in snap.at_peak.values())
    assert measured_total(snap) != sum(v for v in snap.memory.values() if v is not None)  # not the maxima
