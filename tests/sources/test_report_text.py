"""The nvidia-smi-style text of ``--once``, from hand-built snapshots."""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType

from tui.report.smi_text import WIDTH, render_text
from tui.sources.model import GpuInfo, GpuProcess, NvmlStatus

MiB = 1 << 20


def _gpu_rows(text: str, index: int) -> list[list[str]]:
    """The three table rows of GPU ``index`` as lists of stripped cells."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        cells = line.split("|")[1:-1]
        if len(cells) == 3 and cells[0].split()[:1] == [str(index)]:
            return [[c.strip() for c in lines[i + k].split("|")[1:-1]] for k in range(3)]
    raise AssertionError(f"GPU {index} not in:\n{text}")


def test_header_and_table_layout(shots: ModuleType) -> None:
    text = render_text(shots.snapshot(gpus=(shots.full_gpu(0), shots.bare_gpu(1))))
    lines = text.splitlines()
    assert "Driver Version: 550.54.15" in text and "CUDA Version: 12.4" in text
    for header in ("Persistence-M", "Bus-Id", "Disp.A", "Volatile Uncorr. ECC", "Pwr:Usage/Cap",
                   "Memory-Usage", "GPU-Util", "Compute M.", "MIG M."):  # fmt: skip
        assert header in text
    table = [line for line in lines if line.startswith(("|", "+"))]
    assert table and all(len(line) == WIDTH for line in table), [len(x) for x in table]


def test_full_gpu_fields_where_nvidia_smi_puts_them(shots: ModuleType) -> None:
    g = shots.full_gpu(0)
    row1, row2, row3 = _gpu_rows(render_text(shots.snapshot(gpus=(g,))), 0)
    assert row1[0].split() == ["0", *g.name.split(), "On"]
    assert row1[1].split() == [g.bus_id, "Off"]
    assert row1[2] == str(g.ecc_volatile_uncorrected)
    assert row2[0].split() == [
        f"{g.fan_percent}%",
        f"{g.temperature_c}C",
        f"P{g.performance_state}",
        f"{round(g.power_w)}W",
        "/",
        f"{round(g.power_limit_w)}W",
    ]
    assert row2[1].split() == [f"{g.memory_used // MiB}MiB", "/", f"{g.memory_total // MiB}MiB"]
    assert row2[2].split() == [f"{g.gpu_util}%", "E.", "Process"]
    assert row3 == ["", "", "Disabled"]


def test_na_exactly_where_values_are_missing(shots: ModuleType) -> None:
    row1, row2, row3 = _gpu_rows(render_text(shots.snapshot(gpus=(shots.bare_gpu(1),))), 1)
    assert row1[0].split() == ["1", "N/A", "N/A"]
    assert row1[1].split() == ["N/A", "N/A"]
    assert row1[2] == "N/A"
    assert row2[0].split() == ["N/A", "N/A", "N/A", "N/A", "/", "N/A"]
    assert row2[1].split() == ["N/A", "/", "N/A"]
    assert row2[2].split() == ["N/A", "N/A"]
    assert row3[2] == "N/A"
    # Only some fields missing: just those cells say N/A.
    partial = replace(shots.full_gpu(2), fan_percent=None, ecc_volatile_uncorrected=None, mig_mode=None)
    row1, row2, row3 = _gpu_rows(render_text(shots.snapshot(gpus=(partial,))), 2)
    assert row2[0].split()[0] == "N/A" and row2[0].split()[1] == f"{partial.temperature_c}C"
    assert row1[2] == "N/A" and row3[2] == "N/A"
    assert row1[1].split() == [partial.bus_id, "Off"]


def test_lost_gpu_is_err_and_others_unaffected(shots: ModuleType) -> None:
    lost = GpuInfo(index=1, lost=True, error="GPU is lost")
    text = render_text(shots.snapshot(gpus=(shots.full_gpu(0), lost, shots.full_gpu(2))))
    row1, row2, _ = _gpu_rows(text, 1)
    assert "ERR!" in row1[0] and "ERR!" in row2[1]
    assert "GPU 1: lost (GPU is lost)" in text
    ok_row1, _, _ = _gpu_rows(text, 2)
    assert shots.full_gpu(2).bus_id in ok_row1[1]


def test_process_table_and_markup_like_names_verbatim(shots: ModuleType) -> None:
    procs = (
        GpuProcess(0, 4242, "C", gpu_memory=70_000 * MiB, command="python train.py [rank0]"),
        GpuProcess(gpu_index=0, pid=77, type="C+G", gpu_memory=None, name="[/]"),
        GpuProcess(1, 99, "G", gpu_memory=12 * MiB, gpu_instance_id=1, compute_instance_id=0, alive=False),
    )
    text = render_text(shots.snapshot(gpus=(shots.full_gpu(0), shots.full_gpu(1)), processes=procs))
    for header in ("GPU", "GI", "CI", "PID", "Type", "Process name", "GPU Memory", "Usage"):
        assert header in text
    rows = {int(line.split()[4]): line.split("|")[1] for line in text.splitlines()
            if line.startswith("|") and len(line.split()) > 6 and line.split()[4].isdigit()}  # fmt: skip
    assert rows[4242].split() == ["0", "N/A", "N/A", "4242", "C", "python", "train.py", "[rank0]", "70000MiB"]
    assert rows[77].split() == ["0", "N/A", "N/A", "77", "C+G", "[/]", "N/A"]
    assert rows[99].split() == ["1", "1", "0", "99", "G", "N/A", "12MiB"]
    assert "python train.py [rank0]" in text


def test_control_characters_cannot_reach_the_terminal(shots: ModuleType) -> None:
    proc = GpuProcess(gpu_index=0, pid=5, type="C", command="evil\x1b[2J\nname")
    text = render_text(shots.snapshot(gpus=(shots.full_gpu(0),), processes=(proc,)))
    assert "\x1b" not in text and "evil\\x1b[2J\\nname" in text  # shown, one line, not obeyed


def test_no_driver_shows_reason_and_host(shots: ModuleType) -> None:
    reason = "NVIDIA driver not found (libnvidia-ml.so.1 could not be loaded)"
    text = render_text(shots.snapshot(status=NvmlStatus(available=False, reason=reason)))
    assert reason in text
    assert "Host node-17: 64 CPUs, CPU 12.5%, load 1.50 1.25 1.00, memory 100.0GiB / 512.0GiB" in text
    assert "Processes:" not in text


def test_zero_gpus_like_nvidia_smi(shots: ModuleType) -> None:
    assert "No devices were found" in render_text(shots.snapshot())


def test_training_blocks_appended_verbatim(shots: ModuleType) -> None:
    text = render_text(shots.snapshot(gpus=(shots.full_gpu(0),)), training="ANATOMY [bold]x[/]\n")
    assert text.rstrip().endswith("ANATOMY [bold]x[/]")
    text = render_text(shots.snapshot(), training=["a", "b"])
    assert text.rstrip().endswith("a\nb")
