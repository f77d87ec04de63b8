"""Named scenarios for manual runs and tmux tests, also shipped as JSON in ``tui/simnvml/scenarios/``.

They list no processes (processes need real PIDs: build with ``Scenario.demo_box(pids=...)``).

    python -m tui.simnvml.presets [DIR]     # (re)write the JSON files (default: the package's)
    python -m tui.simnvml.run --scenario tui/simnvml/scenarios/old-driver.json -- nvitop --once
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from tui.simnvml.curves import Curve
from tui.simnvml.scenario import Faults, Scenario, SimGpu, SimMigDevice
from tui.simnvml.scenario import MiB as _MiB

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


def _old_driver() -> Scenario:
    box = Scenario.demo_box(4)
    box.faults = Faults(old_driver=True)
    box.driver_version, box.cuda_driver_version, box.nvml_version = "470.199.02", 11040, "11.470.199.02"
    box.name = "old-driver"
    return box


def _gpu_lost() -> Scenario:
    box = Scenario.demo_box(4)
    box.faults = Faults(lost_after_s={2: 10.0})
    box.name = "gpu-lost"
    return box


def _mixed_support() -> Scenario:
    box = Scenario.demo_box(2)
    box.gpus.append(
        SimGpu(
            name="NVIDIA GeForce RTX 4090",
            memory_total=24564 * _MiB,
            memory_reserved=312 * _MiB,
            power_limit_w=450.0,
            power_default_limit_w=450.0,
            power_max_limit_w=600.0,
            fan_percent=Curve(base=45, amplitude=15, period_s=30, minimum=30, maximum=100),
            num_fans=2,
            temperature_c=Curve(base=58, amplitude=8, period_s=30),
            power_w=Curve(base=250, amplitude=120, period_s=19, minimum=20),
            gpu_util=Curve(base=60, amplitude=35, period_s=19, minimum=0, maximum=100),
            display_mode=True,
            display_active=True,
            ecc_mode=False,
            architecture="Ada",
            cuda_compute_capability=(8, 9),
            pcie_link_gen=4,
            pcie_max_link_gen=4,
        )
    )
    box.validate()
    # GPU 1 lost some sensors; the GeForce card has neither ECC nor MIG nor per-process samples.
    box.faults = Faults(
        unsupported={1: ("power_usage", "temperature"), 2: ("ecc", "mig_mode", "process_utilization")}
    )
    box.name = "mixed-support"
    return box


def _mig() -> Scenario:
    gpu = SimGpu(
        mig_mode=True,
        mig_devices=[
            SimMigDevice(
                gpu_instance_id=1, compute_instance_id=0, profile="3g.40gb", memory_total=40192 * _MiB
            ),
            SimMigDevice(
                gpu_instance_id=2, compute_instance_id=0, profile="2g.20gb", memory_total=19968 * _MiB
            ),
            SimMigDevice(
                gpu_instance_id=3, compute_instance_id=0, profile="1g.10gb", memory_total=9856 * _MiB
            ),
        ],
    )
    return Scenario(gpus=[gpu, SimGpu()], name="mig")


PRESETS: dict[str, Callable[[], Scenario]] = {
    "demo-8xh100": lambda: Scenario.demo_box(8),
    "one-gpu": lambda: Scenario.demo_box(1),
    "zero-gpus": lambda: Scenario(name="zero-gpus"),
    "old-driver": _old_driver,
    "gpu-lost": _gpu_lost,
    "mixed-support": _mixed_support,
    "mig": _mig,
    "no-library": lambda: Scenario(faults=Faults(library_missing=True), name="no-library"),
    "driver-not-loaded": lambda: Scenario(
        faults=Faults(init_error="DRIVER_NOT_LOADED"), name="driver-not-loaded"
    ),
    "no-permission": lambda: Scenario.build(
        1, faults=Faults(init_error="NO_PERMISSION"), name="no-permission"
    ),
}


def preset(name: str) -> Scenario:
    """A fresh copy of the named preset (KeyError for unknown names)."""
    return PRESETS[name]()


def path(name: str) -> Path:
    """The packaged JSON file of the named preset."""
    if name not in PRESETS:
        raise KeyError(name)
    return SCENARIO_DIR / f"{name}.json"


def write_all(directory: Path = SCENARIO_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in PRESETS.items():
        target = directory / f"{name}.json"
        build().to_json(target)
        written.append(target)
    return written


if __name__ == "__main__":
    for written_path in write_all(Path(sys.argv[1]) if len(sys.argv) > 1 else SCENARIO_DIR):
        print(written_path)
