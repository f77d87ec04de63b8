"""A simulated machine: GPUs, the processes on them, the driver, and what goes wrong.

``Scenario`` is plain data with a JSON form (``to_json`` / ``from_json``), so the same box can be
loaded by another process (``ANATOMY_TOP_SIMULATE=<file>``, ``python -m tui.simnvml.run``).
Units: bytes, watts, degrees Celsius, percent, MHz, seconds since install.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import uuid as uuid_module
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tui.simnvml.abi import ARCHITECTURES, COMPUTE_MODES, Return
from tui.simnvml.curves import Curve, ScenarioError, curve_from_json

# The parts of a box live in tui.simnvml.parts; their readers import them from here too.
from tui.simnvml.parts import (
    FIELDS,
    INIT_ERRORS,
    OLD_DRIVER_MISSING,
    PROCESS_TYPES,
    Faults,
    GiB,
    MiB,
    SimGpu,
    SimMigDevice,
    SimProcess,
)

__all__ = [
    "FIELDS",
    "INIT_ERRORS",
    "OLD_DRIVER_MISSING",
    "PROCESS_TYPES",
    "Faults",
    "GiB",
    "MiB",
    "Scenario",
    "ScenarioError",
    "SimGpu",
    "SimMigDevice",
    "SimProcess",
    "parse_bus_id",
]


@dataclass
class Scenario:
    gpus: list[SimGpu] = field(default_factory=list)
    processes: list[SimProcess] = field(default_factory=list)
    faults: Faults = field(default_factory=Faults)
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040  # 1000 * major + 10 * minor
    nvml_version: str = "12.550.54.15"
    name: str = "custom"
    # Wall time each NVML call takes (µs), spent outside the simulator's lock with the GIL released, as
    # a real call waits in the driver's ioctl: a simulated call costs ~10 µs of Python, a real one tens
    # of µs. Benchmarks set it to compare programs at a realistic cost per call.
    call_latency_us: float = 0.0

    def __post_init__(self) -> None:
        self.validate()

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def demo_box(cls, n_gpus: int = 8, pids: Sequence[int] | None = None, seed: int = 0) -> Scenario:
        """``n_gpus`` × "NVIDIA H100 80GB HBM3" on driver 550.54.15 / CUDA 12.4, busy with training.

        ``pids`` (real local PIDs, e.g. from :func:`tui.simnvml.processes.spawn_sleepers`) are spread
        over the GPUs round-robin, one training rank each; without them the box has no processes.
        """
        _check_gpu_count(n_gpus)
        gpus = []
        for i in range(n_gpus):
            phase = 7.3 * i + 3.1 * seed
            gpus.append(
                SimGpu(
                    temperature_c=Curve(base=62 + (i % 3), amplitude=6, period_s=47, phase_s=phase),
                    power_w=Curve(
                        base=540, amplitude=130, period_s=23, phase_s=phase, minimum=90, maximum=700
                    ),
                    gpu_util=Curve(base=88, amplitude=11, period_s=17, phase_s=phase, minimum=0, maximum=100),
                    memory_util=Curve(
                        base=41, amplitude=14, period_s=13, phase_s=phase, minimum=0, maximum=100
                    ),
                    pcie_tx_kbps=Curve(
                        base=2_400_000, amplitude=1_900_000, period_s=9, phase_s=phase, minimum=0
                    ),
                    pcie_rx_kbps=Curve(
                        base=3_100_000, amplitude=2_500_000, period_s=11, phase_s=phase, minimum=0
                    ),
                    energy_start_mj=8_640_000_000 + 12_345_678 * i,
                )
            )
        pids = list(pids or ()) if n_gpus else []
        per_gpu = [len(pids[i::n_gpus]) for i in range(n_gpus)]
        processes = [
            SimProcess(
                pid=pid,
                gpu_index=k % n_gpus,
                # A GPU's ranks share ~71 GB, as a data-parallel job with several ranks per GPU would.
                used_memory=Curve.constant(71_000 * MiB // per_gpu[k % n_gpus] - (k % 5) * 256 * MiB),
                sm_util=Curve(base=85, amplitude=10, period_s=17, phase_s=7.3 * k, minimum=0, maximum=100),
                memory_util=Curve(
                    base=40, amplitude=12, period_s=13, phase_s=7.3 * k, minimum=0, maximum=100
                ),
            )
            for k, pid in enumerate(pids)
        ]
        return cls(gpus=gpus, processes=processes, name=f"demo-{n_gpus}xH100")

    @classmethod
    def build(
        cls,
        n_gpus: int = 1,
        n_processes: int = 0,
        *,
        pids: Sequence[int] | None = None,
        gpu: SimGpu | None = None,
        process_memory: int = 1 * GiB,
        faults: Faults | None = None,
        name: str = "test",
    ) -> Scenario:
        """A box for tests: ``n_gpus`` copies of ``gpu`` (UUID, bus id etc. per index) and
        ``n_processes`` compute processes round-robin over the GPUs, PID ``pids[k]`` (or the
        synthetic 100000 + k, which need not exist), ``process_memory + k * MiB`` bytes each."""
        _check_gpu_count(n_gpus)
        template = gpu or SimGpu(fan_percent=Curve.constant(30), num_fans=1)
        # Deep copies: validation fills per-GPU identities (UUIDs, MIG UUIDs) in place.
        gpus = [
            dataclasses.replace(copy.deepcopy(template), uuid="", bus_id="", board_id=0, minor_number=-1)
            for _ in range(n_gpus)
        ]
        if n_processes and not n_gpus:
            raise ScenarioError("processes need at least one GPU")
        if pids is not None and len(pids) < n_processes:
            raise ScenarioError(f"{n_processes} processes but only {len(pids)} pids")
        processes = [
            SimProcess(
                pid=pids[k] if pids is not None else 100_000 + k,
                gpu_index=k % n_gpus,
                used_memory=Curve.constant(process_memory + k * MiB),
            )
            for k in range(n_processes)
        ]
        return cls(gpus=gpus, processes=processes, faults=faults or Faults(), name=name)

    # --- validation ---------------------------------------------------------------------------

    def validate(self) -> None:
        """Fill per-index defaults (UUID, bus id, ...) and reject inconsistent boxes (ScenarioError)."""
        _check_gpu_count(len(self.gpus))
        for i, gpu in enumerate(self.gpus):
            _fill_gpu_defaults(i, gpu)
            if gpu.compute_mode not in COMPUTE_MODES:
                raise ScenarioError(f"gpu {i}: compute_mode must be one of {sorted(COMPUTE_MODES)}")
            if gpu.architecture not in ARCHITECTURES:
                raise ScenarioError(f"gpu {i}: architecture must be one of {sorted(ARCHITECTURES)}")
            if not gpu.process_sample_period_s > 0 or gpu.process_sample_buffer < 1:
                raise ScenarioError(f"gpu {i}: process samples need a positive period and buffer")
            if gpu.memory_reserved + gpu.memory_other_used > gpu.memory_total:
                raise ScenarioError(f"gpu {i}: reserved + other used memory exceeds the total")
            for j, mig in enumerate(gpu.mig_devices):
                if not mig.uuid:
                    mig.uuid = "MIG-" + str(uuid_module.uuid5(uuid_module.NAMESPACE_URL, f"{gpu.uuid}/{j}"))
        for what, values in (
            ("uuid", [g.uuid for g in self.gpus]),
            ("bus_id", [g.bus_id for g in self.gpus]),
        ):
            if len(set(values)) != len(values):
                raise ScenarioError(f"duplicate GPU {what}")
        for k, proc in enumerate(self.processes):
            if not 0 <= proc.gpu_index < len(self.gpus):
                raise ScenarioError(f"process {k} (pid {proc.pid}): no GPU {proc.gpu_index}")
            if proc.type not in PROCESS_TYPES:
                raise ScenarioError(f"process {k} (pid {proc.pid}): type must be one of {PROCESS_TYPES}")
            if proc.pid <= 0 or proc.pid > 0xFFFFFFFF:
                raise ScenarioError(f"process {k}: pid {proc.pid} out of range")
        if not 0 <= self.call_latency_us <= 1_000_000:
            raise ScenarioError("call_latency_us must be between 0 and 1,000,000")
        faults = self.faults
        if faults.init_error is not None and faults.init_error not in Return.__members__:
            raise ScenarioError(f"faults.init_error: unknown NVML error {faults.init_error!r}")
        for index, fields in faults.unsupported.items():
            unknown = set(fields) - FIELDS
            if unknown:
                raise ScenarioError(f"faults.unsupported[{index}]: unknown fields {sorted(unknown)}")

    # --- JSON ---------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return _to_jsonable(self)

    def to_json(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scenario:
        if not isinstance(data, dict):
            raise ScenarioError("a scenario is a JSON object")
        kwargs = _kwargs(cls, data, "scenario", skip={"gpus", "processes", "faults"})
        gpus = [_gpu_from_dict(g, f"gpus[{i}]") for i, g in enumerate(_list(data.get("gpus", []), "gpus"))]
        procs = [
            _process_from_dict(p, f"processes[{i}]")
            for i, p in enumerate(_list(data.get("processes", []), "processes"))
        ]
        faults = _faults_from_dict(data.get("faults", {}))
        try:
            return cls(gpus=gpus, processes=procs, faults=faults, **kwargs)
        except TypeError as exc:
            raise ScenarioError(f"scenario: {exc}") from None

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> Scenario:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ScenarioError(f"cannot read scenario {os.fspath(path)!r}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ScenarioError(f"scenario {os.fspath(path)!r} is not valid JSON: {exc}") from None
        return cls.from_dict(data)


# --- helpers -----------------------------------------------------------------------------------


def _check_gpu_count(n: int) -> None:
    if not 0 <= n <= 16:
        raise ScenarioError(f"a simulated box has 0 to 16 GPUs, not {n}")


_DGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def _fill_gpu_defaults(i: int, gpu: SimGpu) -> None:
    if not gpu.uuid:
        gpu.uuid = "GPU-" + str(uuid_module.uuid5(uuid_module.NAMESPACE_URL, f"anatomy-top-sim-gpu-{i}"))
    if not gpu.bus_id:
        bus = _DGX_BUSES[i] if i < len(_DGX_BUSES) else 0xDC + i
        gpu.bus_id = f"00000000:{bus:02X}:00.0"
    if not gpu.serial:
        gpu.serial = f"16549220{i:05d}"
    if not gpu.board_id:
        gpu.board_id = 0x1800 + 0x100 * i
    if gpu.minor_number < 0:
        gpu.minor_number = i


def parse_bus_id(bus_id: str) -> tuple[int, int, int, int]:
    """ "00000000:18:00.0" -> (domain, bus, device, function); ScenarioError when malformed."""
    try:
        domain, bus, rest = bus_id.split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except ValueError:
        raise ScenarioError(f"malformed PCI bus id {bus_id!r}") from None


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, Curve):
        return value.to_json_value()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_jsonable(v) for v in value]
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ScenarioError(f"{what}: expected a list")
    return value


def _kwargs(cls: type, data: dict[str, Any], what: str, skip: Iterable[str] = ()) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ScenarioError(f"{what}: expected an object")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ScenarioError(f"{what}: unknown keys {sorted(unknown)}")
    skip = set(skip)
    return {k: v for k, v in data.items() if k not in skip}


_GPU_CURVES = {
    "temperature_c",
    "power_w",
    "gpu_util",
    "memory_util",
    "encoder_util",
    "decoder_util",
    "pcie_tx_kbps",
    "pcie_rx_kbps",
}


def _gpu_from_dict(data: Any, what: str) -> SimGpu:
    kwargs = _kwargs(SimGpu, data, what)
    for key in _GPU_CURVES:
        if key in kwargs:
            kwargs[key] = curve_from_json(kwargs[key], f"{what}.{key}")
    for key in ("fan_percent", "sm_clock_mhz"):
        if kwargs.get(key) is not None:
            kwargs[key] = curve_from_json(kwargs[key], f"{what}.{key}")
    if "cuda_compute_capability" in kwargs:
        try:
            major, minor = kwargs["cuda_compute_capability"]
            kwargs["cuda_compute_capability"] = (int(major), int(minor))
        except (TypeError, ValueError):
            raise ScenarioError(f"{what}.cuda_compute_capability: expected [major, minor]") from None
    if "mig_devices" in kwargs:
        migs = _list(kwargs["mig_devices"], f"{what}.mig_devices")
        kwargs["mig_devices"] = [
            SimMigDevice(**_kwargs(SimMigDevice, m, f"{what}.mig_devices[{j}]")) for j, m in enumerate(migs)
        ]
    try:
        return SimGpu(**kwargs)
    except TypeError as exc:
        raise ScenarioError(f"{what}: {exc}") from None


def _process_from_dict(data: Any, what: str) -> SimProcess:
    kwargs = _kwargs(SimProcess, data, what)
    for key in ("used_memory", "sm_util", "memory_util"):
        if key in kwargs:
            kwargs[key] = curve_from_json(kwargs[key], f"{what}.{key}")
    try:
        return SimProcess(**kwargs)
    except TypeError as exc:
        raise ScenarioError(f"{what}: {exc}") from None


def _faults_from_dict(data: Any) -> Faults:
    kwargs = _kwargs(Faults, data, "faults")
    try:
        if "missing_symbols" in kwargs:
            kwargs["missing_symbols"] = tuple(
                str(s) for s in _list(kwargs["missing_symbols"], "faults.missing_symbols")
            )
        if "unsupported" in kwargs:
            kwargs["unsupported"] = {
                int(k): tuple(str(f) for f in v) for k, v in kwargs["unsupported"].items()
            }
        if "lost_after_s" in kwargs:
            kwargs["lost_after_s"] = {int(k): float(v) for k, v in kwargs["lost_after_s"].items()}
        return Faults(**kwargs)
    except (AttributeError, TypeError, ValueError) as exc:
        raise ScenarioError(f"faults: {exc}") from None
