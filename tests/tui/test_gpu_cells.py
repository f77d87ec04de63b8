"""The GPU table's cells: nvidia-smi's fields, N/A where NVML said not supported, lost GPUs."""

from __future__ import annotations

import frozen

from tui import format as fmt
from tui.sources.model import GpuInfo
from tui.view.gpus import gpu_view, short_name
from tui.widgets.gpu_table import COLUMN_KEYS, gpu_cells


def _cells(gpu: GpuInfo) -> dict[str, str]:
    return {key: cell.plain for key, cell in zip(COLUMN_KEYS, gpu_cells(gpu_view(gpu)), strict=True)}


def test_every_field_of_a_healthy_gpu_is_shown() -> None:
    gpu = frozen.gpu(3, used=20 * frozen.GiB, util=57)
    cells = _cells(gpu)
    assert cells["gpu"] == "3"
    assert cells["name"] == short_name(gpu.name) == "H100 80GB HBM3"  # the vendor is on every row
    assert cells["memory"].endswith(fmt.fmt_bytes_pair(gpu.memory_used, gpu.memory_total))
    assert cells["util"].endswith("57%")
    assert cells["temp"] == f"{gpu.temperature_c}C"
    assert cells["power"] == fmt.fmt_power(gpu.power_w, gpu.power_limit_w)
    assert cells["perf"] == f"P{gpu.performance_state}"
    assert cells["ecc"] == "0"
    assert cells["persistence"] == "On" and cells["display"] == "Off"
    assert cells["bus"] == gpu.bus_id
    assert cells["compute"] == "Default" and cells["mig"] == "Disabled"
    assert cells["fan"] == fmt.NA  # the frozen H100 has no fan reading


def test_unsupported_fields_are_na_not_zero() -> None:
    cells = _cells(GpuInfo(index=0))
    for key in ("name", "temp", "fan", "perf", "ecc", "persistence", "display", "bus", "compute", "mig"):
        assert cells[key] == fmt.NA, key
    assert cells["util"].endswith(fmt.NA)
    assert cells["power"] == f"{fmt.NA} / {fmt.NA}"


def test_a_lost_gpu_says_so_with_its_error_verbatim() -> None:
    cells = _cells(GpuInfo(index=5, lost=True, error="GPU is lost [Xid 79]"))
    assert cells["name"] == "GPU lost: GPU is lost [Xid 79]"
    assert all(cells[k] == "" for k in COLUMN_KEYS[2:])
