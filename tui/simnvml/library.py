"""The simulated NVIDIA management library: an object that stands in for ``CDLL("libnvidia-ml.so.1")``.

Every exported symbol is a ctypes C function pointer (``CFUNCTYPE(c_int, ...)`` around a Python
function), so callers marshal arguments exactly as for the real library: pointers arrive as
addresses and answers are written into the caller's own structs and buffers. A symbol the
simulated driver lacks raises AttributeError on lookup, as ``CDLL.__getattr__`` does.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tui.simnvml import abi
from tui.simnvml.abi import Return
from tui.simnvml.scenario import Scenario, SimGpu, SimMigDevice, SimProcess, parse_bus_id

Clock = Callable[[], float]

H = "nvmlDevice_t"  # marks a device-handle argument (passed as an opaque pointer)
P = ctypes.c_void_p  # an out-parameter or buffer
U = ctypes.c_uint
INT = ctypes.c_int
ULL = ctypes.c_ulonglong
S = ctypes.c_char_p  # an input string


@dataclass(frozen=True)
class _Spec:
    name: str
    argtypes: tuple[Any, ...]
    restype: Any
    impl: Callable[..., int]
    device: bool  # first argument is a device handle: resolve it, check lost / unsupported
    field: str | None  # scenario field name for Faults.unsupported
    needs_init: bool


_SYMBOLS: dict[str, _Spec] = {}


def _export(
    name: str,
    *argtypes: Any,
    restype: Any = ctypes.c_int,
    field: str | None = None,
    needs_init: bool = True,
) -> Callable[[Callable[..., int]], Callable[..., int]]:
    def register(impl: Callable[..., int]) -> Callable[..., int]:
        device = bool(argtypes) and argtypes[0] is H
        _SYMBOLS[name] = _Spec(name, argtypes, restype, impl, device, field, needs_init)
        return impl

    return register


def exported_symbols() -> frozenset[str]:
    """Every symbol the simulated library implements (before faults remove any)."""
    return frozenset(_SYMBOLS)


@dataclass(frozen=True)
class _Device:
    """What a handle points at: a GPU, or one of its MIG devices."""

    index: int
    gpu: SimGpu
    mig_index: int | None = None
    mig: SimMigDevice | None = None


# --- writing into the caller's memory ---------------------------------------------------------


def _put(ctype: type[Any], addr: int | None, value: int | float) -> int:
    if not addr:
        return Return.INVALID_ARGUMENT
    ctype.from_address(addr).value = value
    return Return.SUCCESS


def _put_str(addr: int | None, size: int, text: str) -> int:
    if not addr:
        return Return.INVALID_ARGUMENT
    data = text.encode() + b"\0"
    if len(data) > size:
        return Return.INSUFFICIENT_SIZE
    ctypes.memmove(addr, data, len(data))
    return Return.SUCCESS


def _at(struct: type[Any], addr: int | None) -> Any:
    return struct.from_address(addr) if addr else None


_PR_SET_TIMERSLACK = 29
_precise = threading.local()


def _wait(seconds: float) -> None:
    """Sleep ``seconds``, the GIL released, as a thread waits in a real call's ioctl. A thread's sleeps
    overshoot by its timer slack (50 µs by default), so each thread that calls the library with a latency
    set sleeps with a 1 µs slack (Linux; elsewhere as it is). Wake-up latency still adds (a 50 µs call
    takes 60-90 µs on a busy machine): a spin would be exact on an idle machine but is preempted for
    whole time slices on a busy one."""
    if not getattr(_precise, "done", False):
        _precise.done = True
        with contextlib.suppress(Exception):  # not Linux, no libc: the default slack
            ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    time.sleep(seconds)


class SimulatedNvml:
    """A simulated libnvidia-ml for one :class:`Scenario`.

    Attributes:
        calls: number of calls per symbol (lookups that failed are not calls).
        missing: lookups of symbols this library does not export (old-driver faults included).
        unimplemented: the subset of ``missing`` that no simulated driver implements.
        errors: exceptions raised inside callbacks (bugs of the simulator; the call returned UNKNOWN).
    """

    def __init__(self, scenario: Scenario, clock: Clock | None = None) -> None:
        self.scenario = scenario
        self._clock: Clock = clock or time.monotonic
        self._t0 = self._clock()
        self._wall_t0_us = int(time.time() * 1_000_000)
        self.calls: Counter[str] = Counter()
        self.missing: Counter[str] = Counter()
        self.unimplemented: set[str] = set()
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._init_count = 0
        faults = scenario.faults
        self._absent = faults.all_missing_symbols()
        self._unsupported = {i: frozenset(f) for i, f in faults.unsupported.items()}
        self._lost_after = dict(faults.lost_after_s)
        self._init_error = Return[faults.init_error] if faults.init_error else None
        # Handles are addresses of small buffers we own, so they are valid, distinct pointers.
        self._handle_buffers: list[ctypes.Array[ctypes.c_char]] = []
        self._devices: dict[int, _Device] = {}
        self._gpu_handles: list[int] = []
        self._mig_handles: dict[tuple[int, int], int] = {}
        for i, gpu in enumerate(scenario.gpus):
            self._gpu_handles.append(self._new_handle(_Device(i, gpu)))
            for j, mig in enumerate(gpu.mig_devices):
                self._mig_handles[(i, j)] = self._new_handle(_Device(i, gpu, j, mig))
        self._error_strings: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._energy: dict[int, tuple[float, float]] = {}
        self._latency_s = scenario.call_latency_us / 1e6
        self._functions: dict[str, Any] = {
            name: self._make_function(spec) for name, spec in _SYMBOLS.items() if name not in self._absent
        }

    # --- the CDLL-like surface ----------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not ordinary attributes: i.e. symbol lookups.
        functions = self.__dict__.get("_functions")
        if functions is not None and name in functions:
            return functions[name]
        if name.startswith("nvml") and functions is not None:
            with self._lock:
                self.missing[name] += 1
                if name not in _SYMBOLS:
                    self.unimplemented.add(name)
        raise AttributeError(f"simulated libnvidia-ml has no symbol {name!r}")

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__(name)

    @property
    def total_calls(self) -> int:
        with self._lock:  # NVML may be queried from a worker thread meanwhile
            return sum(self.calls.values())

    def elapsed(self) -> float:
        """Seconds of simulated time since install (the ``t`` of every curve)."""
        return self._clock() - self._t0

    def reset_counts(self) -> None:
        with self._lock:
            self.calls.clear()
            self.missing.clear()

    def counts_json(self) -> dict[str, Any]:
        with self._lock:
            calls, missing = dict(sorted(self.calls.items())), dict(sorted(self.missing.items()))
            unimplemented = sorted(self.unimplemented)
        return {
            "scenario": self.scenario.name,
            "total": sum(calls.values()),
            "calls": calls,
            "missing": missing,
            "unimplemented": unimplemented,
            "errors": list(self.errors),
        }

    # --- plumbing -----------------------------------------------------------------------------

    def _new_handle(self, device: _Device) -> int:
        buf = ctypes.create_string_buffer(8)
        self._handle_buffers.append(buf)
        addr = ctypes.addressof(buf)
        self._devices[addr] = device
        return addr

    def _make_function(self, spec: _Spec) -> Any:
        impl, name = spec.impl, spec.name

        def call(*args: Any) -> Any:
            with self._lock:
                self.calls[name] += 1
            if self._latency_s:
                _wait(self._latency_s)
            try:
                if spec.needs_init and self._init_count == 0:
                    return Return.UNINITIALIZED
                if not spec.device:
                    return int(impl(self, *args))
                device = self._devices.get(args[0] or 0)
                if device is None:
                    return Return.INVALID_ARGUMENT
                if self._is_lost(device.index):
                    return Return.GPU_IS_LOST
                if spec.field is not None and spec.field in self._unsupported.get(device.index, ()):
                    return Return.NOT_SUPPORTED
                return int(impl(self, device, *args[1:]))
            except Exception as exc:  # a simulator bug must not crash the caller's process
                self.errors.append(f"{name}: {exc!r}")
                return Return.UNKNOWN

        argtypes = [ctypes.c_void_p if a is H else a for a in spec.argtypes]
        prototype = ctypes.CFUNCTYPE(spec.restype, *argtypes)
        return prototype(call)

    def _is_lost(self, index: int) -> bool:
        after = self._lost_after.get(index)
        return after is not None and self.elapsed() >= after

    def _processes(self, device: _Device, kinds: tuple[str, ...]) -> list[SimProcess]:
        procs = [p for p in self.scenario.processes if p.gpu_index == device.index and p.type in kinds]
        if device.mig is not None:
            procs = [
                p
                for p in procs
                if p.gpu_instance_id == device.mig.gpu_instance_id
                and p.compute_instance_id == device.mig.compute_instance_id
            ]
        return procs

    def _used_memory(self, device: _Device, t: float) -> int:
        kinds = ("C", "G", "C+G")
        procs = sum(int(p.used_memory.at(t)) for p in self._processes(device, kinds))
        if device.mig is not None:
            return min(procs, device.mig.memory_total)
        gpu = device.gpu
        return min(procs + gpu.memory_other_used, gpu.memory_total - gpu.memory_reserved)

    def _energy_mj(self, index: int, gpu: SimGpu, t: float) -> int:
        # Integrate the power curve forward from the last answer, so the counter never goes back.
        last_t, energy = self._energy.get(index, (0.0, float(gpu.energy_start_mj)))
        if t > last_t:
            steps = max(1, math.ceil(t - last_t))
            dt = (t - last_t) / steps
            for k in range(steps):
                a, b = last_t + k * dt, last_t + (k + 1) * dt
                energy += 0.5 * (gpu.power_w.at(a) + gpu.power_w.at(b)) * dt * 1000.0
            self._energy[index] = (t, energy)
        return int(energy)

    def _sm_clock(self, gpu: SimGpu, t: float) -> int:
        if gpu.sm_clock_mhz is not None:
            return int(gpu.sm_clock_mhz.at(t))
        util = min(100.0, max(0.0, gpu.gpu_util.at(t)))
        return int(gpu.idle_sm_clock_mhz + (gpu.max_sm_clock_mhz - gpu.idle_sm_clock_mhz) * util / 100.0)

    # --- init / system ------------------------------------------------------------------------

    @_export("nvmlInitWithFlags", U, needs_init=False)
    @_export("nvmlInit_v2", needs_init=False)
    @_export("nvmlInit", needs_init=False)
    def _init(self, flags: int = 0) -> int:
        if self._init_error is not None:
            return self._init_error
        with self._lock:
            self._init_count += 1
        return Return.SUCCESS

    @_export("nvmlShutdown", needs_init=False)
    def _shutdown(self) -> int:
        with self._lock:
            if self._init_count == 0:
                return Return.UNINITIALIZED
            self._init_count -= 1
        return Return.SUCCESS

    @_export("nvmlErrorString", INT, restype=ctypes.c_void_p, needs_init=False)
    def _error_string(self, code: int) -> int:
        buf = self._error_strings.get(code)
        if buf is None:
            text = abi.ERROR_STRINGS.get(code, "Unknown Error")
            buf = self._error_strings.setdefault(code, ctypes.create_string_buffer(text.encode()))
        return ctypes.addressof(buf)

    @_export("nvmlSystemGetDriverVersion", P, U)
    def _driver_version(self, buf: int | None, size: int) -> int:
        return _put_str(buf, size, self.scenario.driver_version)

    @_export("nvmlSystemGetNVMLVersion", P, U)
    def _nvml_version(self, buf: int | None, size: int) -> int:
        return _put_str(buf, size, self.scenario.nvml_version)

    @_export("nvmlSystemGetCudaDriverVersion", P)
    @_export("nvmlSystemGetCudaDriverVersion_v2", P)
    def _cuda_version(self, out: int | None) -> int:
        return _put(ctypes.c_int, out, self.scenario.cuda_driver_version)

    @_export("nvmlSystemGetProcessName", U, P, U)
    def _process_name(self, pid: int, buf: int | None, size: int) -> int:
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
                name = f.read().strip()
        except OSError:
            return Return.NOT_FOUND
        return _put_str(buf, size, name)

    @_export("nvmlDeviceGetCount_v2", P)
    @_export("nvmlDeviceGetCount", P)
    def _count(self, out: int | None) -> int:
        return _put(ctypes.c_uint, out, len(self.scenario.gpus))

    @_export("nvmlDeviceGetHandleByIndex_v2", U, P)
    @_export("nvmlDeviceGetHandleByIndex", U, P)
    def _handle_by_index(self, index: int, out: int | None) -> int:
        if not 0 <= index < len(self._gpu_handles):
            return Return.INVALID_ARGUMENT
        return _put(ctypes.c_void_p, out, self._gpu_handles[index])

    @_export("nvmlDeviceGetHandleByUUID", S, P)
    def _handle_by_uuid(self, uuid: bytes | None, out: int | None) -> int:
        if uuid is None:
            return Return.INVALID_ARGUMENT
        wanted = uuid.decode(errors="replace")
        for addr, device in self._devices.items():
            if (device.mig.uuid if device.mig else device.gpu.uuid) == wanted:
                return _put(ctypes.c_void_p, out, addr)
        return Return.NOT_FOUND

    @_export("nvmlDeviceGetHandleBySerial", S, P)
    def _handle_by_serial(self, serial: bytes | None, out: int | None) -> int:
        if serial is None:
            return Return.INVALID_ARGUMENT
        for i, gpu in enumerate(self.scenario.gpus):
            if gpu.serial == serial.decode(errors="replace"):
                return _put(ctypes.c_void_p, out, self._gpu_handles[i])
        return Return.NOT_FOUND

    @_export("nvmlDeviceGetHandleByPciBusId_v2", S, P)
    @_export("nvmlDeviceGetHandleByPciBusId", S, P)
    def _handle_by_bus_id(self, bus_id: bytes | None, out: int | None) -> int:
        if bus_id is None:
            return Return.INVALID_ARGUMENT
        text = bus_id.decode(errors="replace")
        if text.count(":") == 1:
            text = "0:" + text
        try:
            wanted = parse_bus_id(text)
        except ValueError:
            return Return.INVALID_ARGUMENT
        for i, gpu in enumerate(self.scenario.gpus):
            if parse_bus_id(gpu.bus_id) == wanted:
                return _put(ctypes.c_void_p, out, self._gpu_handles[i])
        return Return.NOT_FOUND

    # --- identity -----------------------------------------------------------------------------

    @_export("nvmlDeviceGetName", H, P, U, field="name")
    def _name(self, d: _Device, buf: int | None, size: int) -> int:
        name = f"{d.gpu.name} MIG {d.mig.profile}" if d.mig else d.gpu.name
        return _put_str(buf, size, name)

    @_export("nvmlDeviceGetUUID", H, P, U, field="uuid")
    def _uuid(self, d: _Device, buf: int | None, size: int) -> int:
        return _put_str(buf, size, d.mig.uuid if d.mig else d.gpu.uuid)

    @_export("nvmlDeviceGetSerial", H, P, U, field="serial")
    def _serial(self, d: _Device, buf: int | None, size: int) -> int:
        return _put_str(buf, size, d.gpu.serial)

    @_export("nvmlDeviceGetIndex", H, P, field="index")
    def _index(self, d: _Device, out: int | None) -> int:
        if d.mig is not None:
            return Return.NOT_SUPPORTED
        return _put(ctypes.c_uint, out, d.index)

    @_export("nvmlDeviceGetMinorNumber", H, P, field="minor_number")
    def _minor(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, d.gpu.minor_number)

    @_export("nvmlDeviceGetBoardId", H, P, field="board_id")
    def _board_id(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, d.gpu.board_id)

    @_export("nvmlDeviceGetMultiGpuBoard", H, P, field="multi_gpu_board")
    def _multi_gpu(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, int(d.gpu.multi_gpu_board))

    @_export("nvmlDeviceGetBrand", H, P, field="brand")
    def _brand(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, abi.BRAND_NVIDIA)

    @_export("nvmlDeviceGetArchitecture", H, P, field="architecture")
    def _architecture(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, abi.ARCHITECTURES[d.gpu.architecture])

    @_export("nvmlDeviceGetCudaComputeCapability", H, P, P, field="cuda_compute_capability")
    def _compute_capability(self, d: _Device, major: int | None, minor: int | None) -> int:
        if not major or not minor:
            return Return.INVALID_ARGUMENT
        _put(ctypes.c_int, major, d.gpu.cuda_compute_capability[0])
        return _put(ctypes.c_int, minor, d.gpu.cuda_compute_capability[1])

    def _fill_pci(self, d: _Device, info: Any, legacy_field: str) -> None:
        domain, bus, device, _function = parse_bus_id(d.gpu.bus_id)
        info.domain, info.bus, info.device = domain, bus, device
        info.pciDeviceId, info.pciSubSystemId = d.gpu.pci_device_id, d.gpu.pci_subsystem_id
        setattr(info, legacy_field, f"{domain:04x}:{bus:02x}:{device:02x}.{_function:x}".upper().encode())

    @_export("nvmlDeviceGetPciInfo_v3", H, P, field="pci")
    def _pci_info(self, d: _Device, out: int | None) -> int:
        info = _at(abi.PciInfo, out)
        if info is None:
            return Return.INVALID_ARGUMENT
        self._fill_pci(d, info, "busIdLegacy")
        info.busId = d.gpu.bus_id.encode()
        return Return.SUCCESS

    @_export("nvmlDeviceGetPciInfo_v2", H, P, field="pci")
    @_export("nvmlDeviceGetPciInfo", H, P, field="pci")
    def _pci_info_v1(self, d: _Device, out: int | None) -> int:
        info = _at(abi.PciInfoV1, out)
        if info is None:
            return Return.INVALID_ARGUMENT
        self._fill_pci(d, info, "busId")
        return Return.SUCCESS

    @_export("nvmlDeviceGetPciInfoExt", H, P, field="pci")
    def _pci_info_ext(self, d: _Device, out: int | None) -> int:
        info = _at(abi.PciInfoExtV1, out)
        if info is None:
            return Return.INVALID_ARGUMENT
        if info.version != abi.PCI_INFO_EXT_V1_VERSION:
            return Return.ARGUMENT_VERSION_MISMATCH
        domain, bus, device, _function = parse_bus_id(d.gpu.bus_id)
        info.domain, info.bus, info.device = domain, bus, device
        info.pciDeviceId, info.pciSubSystemId = d.gpu.pci_device_id, d.gpu.pci_subsystem_id
        info.baseClass, info.subClass = 0x3, 0x2  # display controller / 3D controller
        info.busId = d.gpu.bus_id.encode()
        return Return.SUCCESS

    @_export("nvmlDeviceGetVbiosVersion", H, P, U, field="vbios")
    def _vbios(self, d: _Device, buf: int | None, size: int) -> int:
        return _put_str(buf, size, d.gpu.vbios_version)

    @_export("nvmlDeviceGetInforomImageVersion", H, P, U, field="inforom")
    def _inforom_image(self, d: _Device, buf: int | None, size: int) -> int:
        return _put_str(buf, size, d.gpu.inforom_image_version)

    @_export("nvmlDeviceGetInforomVersion", H, U, P, U, field="inforom")
    def _inforom(self, d: _Device, obj: int, buf: int | None, size: int) -> int:
        versions = {
            abi.INFOROM_OEM: d.gpu.inforom_oem_version,
            abi.INFOROM_ECC: "7.0",
            abi.INFOROM_POWER: "N/A",
        }
        if obj not in versions:
            return Return.INVALID_ARGUMENT
        if obj == abi.INFOROM_POWER:
            return Return.NOT_SUPPORTED
        return _put_str(buf, size, versions[obj])

    @_export("nvmlDeviceGetDriverModel", H, P, P)
    @_export("nvmlDeviceGetDriverModel_v2", H, P, P)
    def _driver_model(self, d: _Device, current: int | None, pending: int | None) -> int:
        return Return.NOT_SUPPORTED  # a Windows-only notion; this simulates Linux

    # --- modes --------------------------------------------------------------------------------

    @_export("nvmlDeviceGetPersistenceMode", H, P, field="persistence_mode")
    def _persistence(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, int(d.gpu.persistence_mode))

    @_export("nvmlDeviceGetDisplayMode", H, P, field="display_mode")
    def _display_mode(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, int(d.gpu.display_mode))

    @_export("nvmlDeviceGetDisplayActive", H, P, field="display_active")
    def _display_active(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, int(d.gpu.display_active))

    @_export("nvmlDeviceGetComputeMode", H, P, field="compute_mode")
    def _compute_mode(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, abi.COMPUTE_MODES[d.gpu.compute_mode])

    @_export("nvmlDeviceGetEccMode", H, P, P, field="ecc")
    def _ecc_mode(self, d: _Device, current: int | None, pending: int | None) -> int:
        if not current or not pending:
            return Return.INVALID_ARGUMENT
        _put(ctypes.c_uint, current, int(d.gpu.ecc_mode))
        return _put(ctypes.c_uint, pending, int(d.gpu.ecc_mode))

    @_export("nvmlDeviceGetTotalEccErrors", H, U, U, P, field="ecc")
    def _ecc_errors(self, d: _Device, error_type: int, counter_type: int, out: int | None) -> int:
        if not d.gpu.ecc_mode:
            return Return.NOT_SUPPORTED
        gpu = d.gpu
        table = {
            (abi.MEMORY_ERROR_UNCORRECTED, abi.VOLATILE_ECC): gpu.ecc_volatile_uncorrected,
            (abi.MEMORY_ERROR_CORRECTED, abi.VOLATILE_ECC): gpu.ecc_volatile_corrected,
            (abi.MEMORY_ERROR_UNCORRECTED, abi.AGGREGATE_ECC): gpu.ecc_aggregate_uncorrected,
            (abi.MEMORY_ERROR_CORRECTED, abi.AGGREGATE_ECC): gpu.ecc_aggregate_corrected,
        }
        if (error_type, counter_type) not in table:
            return Return.INVALID_ARGUMENT
        return _put(ctypes.c_ulonglong, out, table[(error_type, counter_type)])

    @_export("nvmlDeviceGetMigMode", H, P, P, field="mig_mode")
    def _mig_mode(self, d: _Device, current: int | None, pending: int | None) -> int:
        if not current or not pending:
            return Return.INVALID_ARGUMENT
        _put(ctypes.c_uint, current, int(d.gpu.mig_mode))
        return _put(ctypes.c_uint, pending, int(d.gpu.mig_mode))

    @_export("nvmlDeviceGetMaxMigDeviceCount", H, P, field="mig_mode")
    def _max_mig(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, d.gpu.max_mig_devices if d.gpu.mig_mode and d.mig is None else 0)

    @_export("nvmlDeviceGetMigDeviceHandleByIndex", H, U, P, field="mig_mode")
    def _mig_handle(self, d: _Device, index: int, out: int | None) -> int:
        if d.mig is not None or not d.gpu.mig_mode:
            return Return.INVALID_ARGUMENT if d.mig is not None else Return.NOT_FOUND
        if index >= d.gpu.max_mig_devices:
            return Return.INVALID_ARGUMENT
        handle = self._mig_handles.get((d.index, index))
        if handle is None:
            return Return.NOT_FOUND
        return _put(ctypes.c_void_p, out, handle)

    @_export("nvmlDeviceIsMigDeviceHandle", H, P)
    def _is_mig(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, int(d.mig is not None))

    @_export("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", H, P)
    def _parent_handle(self, d: _Device, out: int | None) -> int:
        if d.mig is None:
            return Return.INVALID_ARGUMENT
        return _put(ctypes.c_void_p, out, self._gpu_handles[d.index])

    @_export("nvmlDeviceGetGpuInstanceId", H, P)
    def _gi_id(self, d: _Device, out: int | None) -> int:
        if d.mig is None:
            return Return.NOT_SUPPORTED
        return _put(ctypes.c_uint, out, d.mig.gpu_instance_id)

    @_export("nvmlDeviceGetComputeInstanceId", H, P)
    def _ci_id(self, d: _Device, out: int | None) -> int:
        if d.mig is None:
            return Return.NOT_SUPPORTED
        return _put(ctypes.c_uint, out, d.mig.compute_instance_id)

    # --- sensors ------------------------------------------------------------------------------

    @_export("nvmlDeviceGetFanSpeed", H, P, field="fan")
    def _fan(self, d: _Device, out: int | None) -> int:
        if d.gpu.fan_percent is None:
            return Return.NOT_SUPPORTED
        return _put(ctypes.c_uint, out, round(d.gpu.fan_percent.at(self.elapsed())))

    @_export("nvmlDeviceGetFanSpeed_v2", H, U, P, field="fan")
    def _fan_v2(self, d: _Device, fan: int, out: int | None) -> int:
        if d.gpu.fan_percent is None:
            return Return.NOT_SUPPORTED
        if fan >= max(1, d.gpu.num_fans):
            return Return.INVALID_ARGUMENT
        return _put(ctypes.c_uint, out, round(d.gpu.fan_percent.at(self.elapsed())))

    @_export("nvmlDeviceGetNumFans", H, P, field="fan")
    def _num_fans(self, d: _Device, out: int | None) -> int:
        if d.gpu.fan_percent is None:
            return Return.NOT_SUPPORTED
        return _put(ctypes.c_uint, out, max(1, d.gpu.num_fans))

    @_export("nvmlDeviceGetTemperature", H, U, P, field="temperature")
    def _temperature(self, d: _Device, sensor: int, out: int | None) -> int:
        if sensor != abi.TEMPERATURE_GPU:
            return Return.INVALID_ARGUMENT
        return _put(ctypes.c_uint, out, round(d.gpu.temperature_c.at(self.elapsed())))

    @_export("nvmlDeviceGetTemperatureV", H, P, field="temperature")
    def _temperature_v(self, d: _Device, out: int | None) -> int:
        info = _at(abi.TemperatureV1, out)
        if info is None:
            return Return.INVALID_ARGUMENT
        if info.version != abi.TEMPERATURE_V1_VERSION:
            return Return.ARGUMENT_VERSION_MISMATCH
        if info.sensorType != abi.TEMPERATURE_GPU:
            return Return.INVALID_ARGUMENT
        info.temperature = round(d.gpu.temperature_c.at(self.elapsed()))
        return Return.SUCCESS

    @_export("nvmlDeviceGetTemperatureThreshold", H, U, P, field="temperature_thresholds")
    def _temperature_threshold(self, d: _Device, which: int, out: int | None) -> int:
        gpu = d.gpu
        table = {
            abi.THRESHOLD_SHUTDOWN: gpu.shutdown_temp_c,
            abi.THRESHOLD_SLOWDOWN: gpu.slowdown_temp_c,
            abi.THRESHOLD_MEM_MAX: gpu.mem_max_temp_c,
            abi.THRESHOLD_GPU_MAX: gpu.gpu_max_temp_c,
        }
        if which not in table:
            return Return.NOT_SUPPORTED
        return _put(ctypes.c_uint, out, table[which])

    @_export("nvmlDeviceGetPerformanceState", H, P, field="performance_state")
    @_export("nvmlDeviceGetPowerState", H, P, field="performance_state")
    def _pstate(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, d.gpu.performance_state)

    @_export("nvmlDeviceGetPowerUsage", H, P, field="power_usage")
    def _power(self, d: _Device, out: int | None) -> int:
        if d.mig is not None:
            return Return.NOT_SUPPORTED
        return _put(ctypes.c_uint, out, round(d.gpu.power_w.at(self.elapsed()) * 1000))

    @_export("nvmlDeviceGetTotalEnergyConsumption", H, P, field="energy")
    def _energy_counter(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_ulonglong, out, self._energy_mj(d.index, d.gpu, self.elapsed()))

    @_export("nvmlDeviceGetPowerManagementLimit", H, P, field="power_limit")
    @_export("nvmlDeviceGetEnforcedPowerLimit", H, P, field="power_limit")
    def _power_limit(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, round(d.gpu.power_limit_w * 1000))

    @_export("nvmlDeviceGetPowerManagementDefaultLimit", H, P, field="power_limit")
    def _power_default_limit(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, round(d.gpu.power_default_limit_w * 1000))

    @_export("nvmlDeviceGetPowerManagementLimitConstraints", H, P, P, field="power_limit")
    def _power_constraints(self, d: _Device, low: int | None, high: int | None) -> int:
        if not low or not high:
            return Return.INVALID_ARGUMENT
        _put(ctypes.c_uint, low, round(d.gpu.power_min_limit_w * 1000))
        return _put(ctypes.c_uint, high, round(d.gpu.power_max_limit_w * 1000))

    @_export("nvmlDeviceGetPowerManagementMode", H, P, field="power_limit")
    def _power_mode(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, abi.ENABLED)

    # --- memory and utilization ---------------------------------------------------------------

    def _memory_figures(self, d: _Device) -> tuple[int, int, int]:
        """(total, reserved, used excluding reserved) now."""
        used = self._used_memory(d, self.elapsed())
        if d.mig is not None:
            return d.mig.memory_total, 0, used
        return d.gpu.memory_total, d.gpu.memory_reserved, used

    @_export("nvmlDeviceGetMemoryInfo", H, P, field="memory")
    def _memory_v1(self, d: _Device, out: int | None) -> int:
        info = _at(abi.MemoryV1, out)
        if info is None:
            return Return.INVALID_ARGUMENT
        total, reserved, used = self._memory_figures(d)
        # The v1 struct has no "reserved": the driver's reservation counts as used.
        info.total, info.used, info.free = total, used + reserved, total - used - reserved
        return Return.SUCCESS

    @_export("nvmlDeviceGetMemoryInfo_v2", H, P, field="memory")
    def _memory_v2(self, d: _Device, out: int | None) -> int:
        info = _at(abi.MemoryV2, out)
        if info is None:
            return Return.INVALID_ARGUMENT
        if info.version != abi.MEMORY_V2_VERSION:
            return Return.ARGUMENT_VERSION_MISMATCH
        total, reserved, used = self._memory_figures(d)
        info.total, info.reserved, info.used, info.free = total, reserved, used, total - reserved - used
        return Return.SUCCESS

    @_export("nvmlDeviceGetBAR1MemoryInfo", H, P, field="bar1")
    def _bar1(self, d: _Device, out: int | None) -> int:
        info = _at(abi.Bar1Memory, out)
        if info is None:
            return Return.INVALID_ARGUMENT
        info.bar1Total, info.bar1Used = d.gpu.bar1_total, d.gpu.bar1_used
        info.bar1Free = d.gpu.bar1_total - d.gpu.bar1_used
        return Return.SUCCESS

    @_export("nvmlDeviceGetUtilizationRates", H, P, field="utilization")
    def _utilization(self, d: _Device, out: int | None) -> int:
        if d.gpu.mig_mode:
            return Return.NOT_SUPPORTED  # as on real GPUs: no whole-GPU utilization under MIG
        info = _at(abi.Utilization, out)
        if info is None:
            return Return.INVALID_ARGUMENT
        t = self.elapsed()
        info.gpu = _percent(d.gpu.gpu_util.at(t))
        info.memory = _percent(d.gpu.memory_util.at(t))
        return Return.SUCCESS

    @_export("nvmlDeviceGetEncoderUtilization", H, P, P, field="encoder")
    def _encoder(self, d: _Device, util: int | None, period: int | None) -> int:
        if not util or not period:
            return Return.INVALID_ARGUMENT
        _put(ctypes.c_uint, period, 167_000)
        return _put(ctypes.c_uint, util, _percent(d.gpu.encoder_util.at(self.elapsed())))

    @_export("nvmlDeviceGetDecoderUtilization", H, P, P, field="decoder")
    def _decoder(self, d: _Device, util: int | None, period: int | None) -> int:
        if not util or not period:
            return Return.INVALID_ARGUMENT
        _put(ctypes.c_uint, period, 167_000)
        return _put(ctypes.c_uint, util, _percent(d.gpu.decoder_util.at(self.elapsed())))

    # --- clocks -------------------------------------------------------------------------------

    def _clock_now(self, gpu: SimGpu, kind: int) -> int | None:
        return {
            abi.CLOCK_GRAPHICS: self._sm_clock(gpu, self.elapsed()),
            abi.CLOCK_SM: self._sm_clock(gpu, self.elapsed()),
            abi.CLOCK_MEM: gpu.mem_clock_mhz,
            abi.CLOCK_VIDEO: gpu.video_clock_mhz,
        }.get(kind)

    def _clock_max(self, gpu: SimGpu, kind: int) -> int | None:
        return {
            abi.CLOCK_GRAPHICS: gpu.max_sm_clock_mhz,
            abi.CLOCK_SM: gpu.max_sm_clock_mhz,
            abi.CLOCK_MEM: gpu.max_mem_clock_mhz,
            abi.CLOCK_VIDEO: gpu.video_clock_mhz,
        }.get(kind)

    @_export("nvmlDeviceGetClockInfo", H, U, P, field="clocks")
    def _clock_info(self, d: _Device, kind: int, out: int | None) -> int:
        value = self._clock_now(d.gpu, kind)
        return Return.INVALID_ARGUMENT if value is None else _put(ctypes.c_uint, out, value)

    @_export("nvmlDeviceGetMaxClockInfo", H, U, P, field="max_clocks")
    def _max_clock_info(self, d: _Device, kind: int, out: int | None) -> int:
        value = self._clock_max(d.gpu, kind)
        return Return.INVALID_ARGUMENT if value is None else _put(ctypes.c_uint, out, value)

    @_export("nvmlDeviceGetClock", H, U, U, P, field="clocks")
    def _clock_by_id(self, d: _Device, kind: int, clock_id: int, out: int | None) -> int:
        value = self._clock_now(d.gpu, kind) if clock_id == 0 else self._clock_max(d.gpu, kind)
        if value is None or clock_id > 3:
            return Return.INVALID_ARGUMENT
        return _put(ctypes.c_uint, out, value)

    @_export("nvmlDeviceGetCurrentClocksEventReasons", H, P, field="clock_event_reasons")
    @_export("nvmlDeviceGetCurrentClocksThrottleReasons", H, P, field="clock_event_reasons")
    def _clock_reasons(self, d: _Device, out: int | None) -> int:
        t, gpu = self.elapsed(), d.gpu
        reasons = 0
        if gpu.gpu_util.at(t) < 1:
            reasons |= abi.CLOCKS_EVENT_REASON_GPU_IDLE
        if gpu.power_w.at(t) >= 0.97 * gpu.power_limit_w:
            reasons |= abi.CLOCKS_EVENT_REASON_SW_POWER_CAP
        return _put(ctypes.c_ulonglong, out, reasons)

    # --- PCIe ---------------------------------------------------------------------------------

    @_export("nvmlDeviceGetCurrPcieLinkGeneration", H, P, field="pcie_link")
    def _pcie_gen(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, d.gpu.pcie_link_gen)

    @_export("nvmlDeviceGetMaxPcieLinkGeneration", H, P, field="pcie_link")
    @_export("nvmlDeviceGetGpuMaxPcieLinkGeneration", H, P, field="pcie_link")
    def _pcie_max_gen(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, d.gpu.pcie_max_link_gen)

    @_export("nvmlDeviceGetCurrPcieLinkWidth", H, P, field="pcie_link")
    def _pcie_width(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, d.gpu.pcie_link_width)

    @_export("nvmlDeviceGetMaxPcieLinkWidth", H, P, field="pcie_link")
    def _pcie_max_width(self, d: _Device, out: int | None) -> int:
        return _put(ctypes.c_uint, out, d.gpu.pcie_max_link_width)

    @_export("nvmlDeviceGetPcieThroughput", H, U, P, field="pcie_throughput")
    def _pcie_throughput(self, d: _Device, counter: int, out: int | None) -> int:
        t = self.elapsed()
        curves = {abi.PCIE_UTIL_TX: d.gpu.pcie_tx_kbps, abi.PCIE_UTIL_RX: d.gpu.pcie_rx_kbps}
        if counter not in curves:
            return Return.INVALID_ARGUMENT
        return _put(ctypes.c_uint, out, max(0, round(curves[counter].at(t))))

    # --- processes ----------------------------------------------------------------------------

    def _write_processes(
        self, d: _Device, kinds: tuple[str, ...], count: int | None, out: int | None, struct: Any
    ) -> int:
        if not count:
            return Return.INVALID_ARGUMENT
        procs = self._processes(d, kinds)
        capacity = ctypes.c_uint.from_address(count)
        n = len(procs)
        if n == 0:
            capacity.value = 0
            return Return.SUCCESS
        if not out or capacity.value < n:
            capacity.value = n
            return Return.INSUFFICIENT_SIZE
        self._fill_processes(d, procs, out, struct)
        capacity.value = n
        return Return.SUCCESS

    def _fill_processes(self, d: _Device, procs: list[SimProcess], out: int, struct: Any) -> None:
        t = self.elapsed()
        mig = d.gpu.mig_mode
        for entry, proc in zip((struct * len(procs)).from_address(out), procs, strict=True):
            entry.pid = proc.pid
            entry.usedGpuMemory = max(0, int(proc.used_memory.at(t)))
            if struct is not abi.ProcessInfoV1:
                entry.gpuInstanceId = _instance_id(proc.gpu_instance_id if mig else None)
                entry.computeInstanceId = _instance_id(proc.compute_instance_id if mig else None)
            if struct is abi.ProcessDetailV1:
                entry.usedGpuCcProtectedMemory = 0

    @_export("nvmlDeviceGetRunningProcessDetailList", H, P, field="processes")
    def _process_detail_list(self, d: _Device, out: int | None) -> int:
        info = _at(abi.ProcessDetailListV1, out)
        if info is None:
            return Return.INVALID_ARGUMENT
        if info.version != abi.PROCESS_DETAIL_LIST_V1_VERSION:
            return Return.ARGUMENT_VERSION_MISMATCH
        kinds = {0: ("C", "C+G"), 1: ("G", "C+G"), 2: ()}.get(info.mode)
        if kinds is None:
            return Return.INVALID_ARGUMENT
        procs = self._processes(d, kinds)
        array = ctypes.cast(info.procArray, ctypes.c_void_p).value
        if procs and (not array or info.numProcArrayEntries < len(procs)):
            info.numProcArrayEntries = len(procs)
            return Return.INSUFFICIENT_SIZE
        if procs and array:
            self._fill_processes(d, procs, array, abi.ProcessDetailV1)
        info.numProcArrayEntries = len(procs)
        return Return.SUCCESS

    @_export("nvmlDeviceGetComputeRunningProcesses_v3", H, P, P, field="processes")
    @_export("nvmlDeviceGetComputeRunningProcesses_v2", H, P, P, field="processes")
    def _compute_procs(self, d: _Device, count: int | None, out: int | None) -> int:
        return self._write_processes(d, ("C", "C+G"), count, out, abi.ProcessInfoV2)

    @_export("nvmlDeviceGetComputeRunningProcesses", H, P, P, field="processes")
    def _compute_procs_v1(self, d: _Device, count: int | None, out: int | None) -> int:
        return self._write_processes(d, ("C", "C+G"), count, out, abi.ProcessInfoV1)

    @_export("nvmlDeviceGetGraphicsRunningProcesses_v3", H, P, P, field="processes")
    @_export("nvmlDeviceGetGraphicsRunningProcesses_v2", H, P, P, field="processes")
    def _graphics_procs(self, d: _Device, count: int | None, out: int | None) -> int:
        return self._write_processes(d, ("G", "C+G"), count, out, abi.ProcessInfoV2)

    @_export("nvmlDeviceGetGraphicsRunningProcesses", H, P, P, field="processes")
    def _graphics_procs_v1(self, d: _Device, count: int | None, out: int | None) -> int:
        return self._write_processes(d, ("G", "C+G"), count, out, abi.ProcessInfoV1)

    @_export("nvmlDeviceGetMPSComputeRunningProcesses_v3", H, P, P, field="processes")
    @_export("nvmlDeviceGetMPSComputeRunningProcesses_v2", H, P, P, field="processes")
    def _mps_procs(self, d: _Device, count: int | None, out: int | None) -> int:
        return self._write_processes(d, (), count, out, abi.ProcessInfoV2)  # no MPS server simulated

    @_export("nvmlDeviceGetMPSComputeRunningProcesses", H, P, P, field="processes")
    def _mps_procs_v1(self, d: _Device, count: int | None, out: int | None) -> int:
        return self._write_processes(d, (), count, out, abi.ProcessInfoV1)

    @_export("nvmlDeviceGetProcessUtilization", H, P, P, ULL, field="process_utilization")
    def _process_utilization(self, d: _Device, out: int | None, count: int | None, last_seen: int) -> int:
        """nvml.h's contract: every sample in the driver's buffer newer than ``last_seen`` (CPU time,
        µs; 0 = the whole buffer), oldest first, one per process with non-zero utilization per
        sampling period, so a process may appear several times. NULL buffer or too small a count:
        INSUFFICIENT_SIZE with the count needed; no sample: NOT_FOUND."""
        if not count:
            return Return.INVALID_ARGUMENT
        if d.gpu.mig_mode:
            return (
                Return.NOT_SUPPORTED
            )  # "On MIG-enabled GPUs, querying process utilization is not supported"
        samples = self._utilization_samples(d, last_seen)
        capacity = ctypes.c_uint.from_address(count)
        if not samples:
            capacity.value = 0
            return Return.NOT_FOUND
        if not out or capacity.value < len(samples):
            capacity.value = len(samples)
            return Return.INSUFFICIENT_SIZE
        for entry, (pid, stamp, sm, mem) in zip(
            (abi.ProcessUtilizationSample * len(samples)).from_address(out), samples, strict=True
        ):
            entry.pid, entry.timeStamp, entry.smUtil, entry.memUtil = pid, stamp, sm, mem
            entry.encUtil = entry.decUtil = 0
        capacity.value = len(samples)
        return Return.SUCCESS

    def sample_timestamp_us(self, t: float) -> int:
        """The CPU timestamp (µs since the epoch) the driver gives a sample taken ``t`` seconds after
        install: wall time at install plus simulated time, so with the default clock it is real time."""
        return self._wall_t0_us + round(t * 1_000_000)

    def _utilization_samples(self, d: _Device, last_seen: int) -> list[tuple[int, int, int, int]]:
        """(pid, timeStamp, smUtil, memUtil) of the buffered samples newer than ``last_seen``. The box
        has been running before install, so the buffer is full from the start."""
        gpu = d.gpu
        procs = sorted(self._processes(d, ("C", "G", "C+G")), key=lambda p: p.pid)
        newest = math.floor(self.elapsed() / gpu.process_sample_period_s)
        out: list[tuple[int, int, int, int]] = []
        for k in range(newest - gpu.process_sample_buffer + 1, newest + 1):
            t = k * gpu.process_sample_period_s
            stamp = self.sample_timestamp_us(t)
            if stamp <= last_seen:
                continue
            for proc in procs:
                sm, mem = _percent(proc.sm_util.at(t)), _percent(proc.memory_util.at(t))
                if sm or mem:
                    out.append((proc.pid, stamp, sm, mem))
        return out

    @_export("nvmlDeviceGetFieldValues", H, INT, P)
    def _field_values(self, d: _Device, count: int, out: int | None) -> int:
        if not out or count <= 0:
            return Return.INVALID_ARGUMENT
        stamp = int(time.time() * 1_000_000)
        for value in (abi.FieldValue * count).from_address(out):
            value.timestamp, value.latencyUsec = stamp, 0
            value.nvmlReturn = Return.NOT_SUPPORTED  # no field ids are simulated
        return Return.SUCCESS


def _percent(value: float) -> int:
    return max(0, min(100, round(value)))


def _instance_id(value: int | None) -> int:
    return abi.INVALID_INSTANCE_ID if value is None else value
