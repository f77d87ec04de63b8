"""The NVML source: nvidia-smi's default view, read through pynvml, as plain data objects.

Design (lessons from nvitop/gpustat, see the field notes):
- one choke point (``NvmlSource._get``) turns every NVMLError into N/A (``None``), except a lost GPU, which
  aborts that GPU's pass and marks it lost while the other GPUs carry on;
- a symbol missing on an older driver falls back to the older call and is remembered, because pynvml
  never caches FunctionNotFound and would retry (and fail) on every refresh;
- three cache tiers per device: identity fields never change, slow fields (modes, limits, ECC, fan,
  temperature, performance state) live ``slow_ttl`` seconds, fast fields (memory, utilization, power,
  processes) ``fast_ttl`` (0 = every refresh);
- process lists are read with a buffer sized from the previous refresh, so one call per list instead of
  pynvml's two-call size protocol;
- a lock around every NVML use; ``close()`` waits for an in-flight query before ``nvmlShutdown``.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import replace

from tui.sources.model import GpuInfo, GpuProcess, NvmlStatus
from tui.sources.nvml_buffers import (
    ProcessEntry,
    ProcessInfoV1,
    gpu_processes,
    read_process_list,
    read_utilization_samples,
)
from tui.sources.nvml_fields import read_fast, read_identity, read_slow
from tui.sources.nvml_reading import (
    OMITTABLE_FIELDS,
    VIEW_ONLY_FIELDS,
    DeviceState,
    NvmlReading,
    decode,
    format_cuda_version,
)

# typing is not imported at run time (~3 ms of --once start-up); the names are for type checkers.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

LIBRARY_MISSING_REASON = "NVIDIA driver not found (libnvidia-ml.so.1 could not be loaded)"
BINDINGS_MISSING_REASON = "nvidia-ml-py (pynvml) is not installed"
CLOSED_REASON = "NVML source closed"

# Per-process utilization is read as the samples of the last PROCESS_SAMPLE_WINDOW_S (lastSeenTimeStamp
# = now - window, in the driver's CPU time): a refresh faster than the driver's sampling period still
# finds each busy process's last sample, and a process that went idle reads 0 % after the window.
PROCESS_SAMPLE_WINDOW_S = 1.0


class _GpuLost(Exception):
    """Raised out of the choke point when a device fell off the bus; ends that device's pass."""


class NvmlSource:
    """Reads nvidia-smi's default view from NVML. Thread-safe; every failure is a value.

    ``slow_ttl``/``fast_ttl`` are the cache lifetimes in seconds of the slow and fast tiers;
    ``init_retry_s`` how long to wait before trying a failed ``nvmlInit`` again. ``wall_clock``: the
    time NVML stamps samples with (seconds since the epoch). ``omit``: names of
    optional fields never asked for (left None), so a one-shot report makes only the calls it prints;
    each one of ``OMITTABLE_FIELDS`` or ``VIEW_ONLY_FIELDS``. ``parallel``: read the GPUs side by side,
    one thread each (a real NVML call waits in the driver with the GIL released, so a node's GPUs cost
    the time of one instead of the sum: the exporter, which reads at the scrape).
    ``unavailable_reason``: NVML is known to be unusable before the first call (a simulated library
    that could not be installed): every reading says so.

    The simulated library (``ANATOMY_TOP_SIMULATE``) is installed once at start-up by the command line
    (``tui.cli``), never from here: this class reads whatever NVML pynvml finds.
    """

    def __init__(
        self,
        *,
        slow_ttl: float = 5.0,
        fast_ttl: float = 0.0,
        init_retry_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        omit: Collection[str] = (),
        unavailable_reason: str | None = None,
        wall_clock: Callable[[], float] = time.time,
        parallel: bool = False,
    ) -> None:
        unknown = set(omit) - set(OMITTABLE_FIELDS) - set(VIEW_ONLY_FIELDS)
        if unknown:
            raise ValueError(
                f"cannot omit {sorted(unknown)}; omittable: {OMITTABLE_FIELDS + VIEW_ONLY_FIELDS}"
            )
        self.omit = frozenset(omit)
        self.unavailable_reason = unavailable_reason
        self.slow_ttl = slow_ttl
        self.fast_ttl = fast_ttl
        self.init_retry_s = init_retry_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._closed = False
        self._initialized = False
        self._init_failed_at: float | None = None
        self._status = NvmlStatus(available=False, reason="NVML not initialised yet")
        self._devices: list[DeviceState] = []
        self._missing: set[str] = set()  # symbols the driver lacks, never asked for again
        self._calls = 0
        self._calls_lock = threading.Lock()  # GPUs read in parallel count their calls here
        self._parallel = parallel
        self._pool: Any = None  # a ThreadPoolExecutor, made at the first parallel read
        self._nvml: Any = None  # the pynvml module once imported

    # ----------------------------------------------------------------- public API
    @property
    def missing_symbols(self) -> frozenset[str]:
        return frozenset(self._missing)

    @property
    def total_calls(self) -> int:
        return self._calls

    def status(self) -> NvmlStatus:
        return self._status

    def query(self) -> NvmlReading:
        with self._lock:
            if self._closed:
                return NvmlReading(NvmlStatus(available=False, reason=CLOSED_REASON))
            before = self._calls
            try:
                return self._query_locked(before)
            except Exception as exc:  # last line of defence: a bug here is a value, not a crash
                status = replace(self._status, available=False, reason=f"NVML query failed: {exc!r}")
                return NvmlReading(status, calls=self._calls - before)

    def close(self) -> None:
        # Taking the lock waits for an in-flight query: shutting NVML down under a running call is
        # the crash-on-quit bug nvitop users hit.
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._initialized and self._nvml is not None:
                with contextlib.suppress(Exception):  # shutting down: nothing left to report to
                    self._nvml.nvmlShutdown()
            self._initialized = False
            self._devices = []
            self._status = NvmlStatus(available=False, reason=CLOSED_REASON)
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> NvmlSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- init
    def _query_locked(self, before: int) -> NvmlReading:
        if not self._initialized and not self._try_init():
            return NvmlReading(self._status, calls=self._calls - before)
        now = self._clock()
        gpus: list[GpuInfo] = []
        processes: list[GpuProcess] = []
        for info, procs in self._read_devices(now):
            gpus.append(info)
            processes.extend(procs)
        return NvmlReading(self._status, tuple(gpus), tuple(processes), self._calls - before)

    def _read_devices(self, now: float) -> list[tuple[GpuInfo, tuple[GpuProcess, ...]]]:
        if not self._parallel or len(self._devices) < 2:
            return [self._read_device(dev, now) for dev in self._devices]
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(
                max_workers=min(len(self._devices), 16), thread_name_prefix="nvml"
            )
        # Each device's state is its own; what they share (the call count, the missing symbols) is
        # counted under a lock or a single set.add. The calling thread reads the first GPU itself.
        first, *rest = self._devices
        futures = [self._pool.submit(self._read_device, dev, now) for dev in rest]
        return [self._read_device(first, now), *(f.result() for f in futures)]

    def _count_call(self) -> None:
        with self._calls_lock:
            self._calls += 1

    def _try_init(self) -> bool:
        now = self._clock()
        if self._init_failed_at is not None and now - self._init_failed_at < self.init_retry_s:
            return False
        ok = self._init()
        self._init_failed_at = None if ok else now
        return ok

    def _init(self) -> bool:
        if self.unavailable_reason is not None:
            self._status = NvmlStatus(available=False, reason=self.unavailable_reason)
            return False
        try:
            import pynvml
        except ImportError:
            self._status = NvmlStatus(available=False, reason=BINDINGS_MISSING_REASON)
            return False
        self._nvml = pynvml
        try:
            self._init_library()
        except pynvml.NVMLError_LibraryNotFound:
            self._status = NvmlStatus(available=False, reason=LIBRARY_MISSING_REASON)
            return False
        except pynvml.NVMLError as exc:
            self._status = NvmlStatus(available=False, reason=f"NVML initialisation failed: {exc}")
            return False
        except OSError as exc:  # a library that loads but is broken
            self._status = NvmlStatus(available=False, reason=f"NVML could not be loaded: {exc}")
            return False
        self._initialized = True
        try:
            driver = decode(self._get(("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)))
            nvml_version = (
                None
                if "nvml_version" in self.omit
                else decode(self._get(("nvmlSystemGetNVMLVersion", pynvml.nvmlSystemGetNVMLVersion)))
            )
            cuda = self._get(
                ("nvmlSystemGetCudaDriverVersion_v2", pynvml.nvmlSystemGetCudaDriverVersion_v2),
                ("nvmlSystemGetCudaDriverVersion", pynvml.nvmlSystemGetCudaDriverVersion),
            )
            count = self._device_count()
        except _GpuLost:  # system calls have no device; a "lost" here means the driver is unusable
            driver = nvml_version = cuda = None
            count = 0
        self._status = NvmlStatus(
            available=True,
            driver_version=driver,
            cuda_driver_version=format_cuda_version(cuda),
            nvml_version=nvml_version,
        )
        self._devices = [self._open_device(i) for i in range(count)]
        return True

    def _init_library(self) -> None:
        pynvml = self._nvml
        self._count_call()
        try:
            pynvml.nvmlInit()  # nvmlInitWithFlags(0)
        except pynvml.NVMLError_FunctionNotFound:
            self._missing.add("nvmlInitWithFlags")
            self._count_call()
            self._raw("nvmlInit_v2")

    def _device_count(self) -> int:
        pynvml = self._nvml

        def count_v1() -> int:
            c_count = ctypes.c_uint()
            self._raw("nvmlDeviceGetCount", ctypes.byref(c_count))
            return c_count.value

        count = self._get(
            ("nvmlDeviceGetCount_v2", pynvml.nvmlDeviceGetCount), ("nvmlDeviceGetCount", count_v1)
        )
        return int(count or 0)

    def _open_device(self, index: int) -> DeviceState:
        pynvml = self._nvml
        dev = DeviceState(index=index)

        def handle_v1() -> Any:
            handle = pynvml.c_nvmlDevice_t()
            self._raw("nvmlDeviceGetHandleByIndex", ctypes.c_uint(index), ctypes.byref(handle))
            return handle

        try:
            dev.handle = self._get_or_raise(
                ("nvmlDeviceGetHandleByIndex_v2", lambda: pynvml.nvmlDeviceGetHandleByIndex(index)),
                ("nvmlDeviceGetHandleByIndex", handle_v1),
            )
        except _GpuLost as exc:
            dev.lost, dev.error = True, str(exc)
        except pynvml.NVMLError as exc:
            # nvidia-smi: "Unable to determine the device handle for GPU ...": unusable, like lost.
            dev.lost, dev.error = True, f"Unable to determine the device handle: {exc}"
        return dev

    # ----------------------------------------------------------------- choke point
    def _raw(self, symbol: str, *args: Any) -> None:
        """Call an NVML symbol pynvml has no wrapper for (older variants); raises NVMLError."""
        fn = self._nvml._nvmlGetFunctionPointer(symbol)
        self._nvml._nvmlCheckReturn(fn(*args))

    def _get(self, *alternatives: tuple[str, Callable[[], Any]]) -> Any:
        """The choke point: the first alternative the driver has; any NVMLError → None (N/A).

        A lost GPU raises ``_GpuLost``; a missing symbol is remembered and its fallback tried.
        """
        try:
            return self._get_or_raise(*alternatives)
        except self._nvml.NVMLError:
            return None

    def _get_or_raise(self, *alternatives: tuple[str, Callable[[], Any]]) -> Any:
        pynvml = self._nvml
        for symbol, call in alternatives:
            if symbol in self._missing:
                continue
            self._count_call()
            try:
                return call()
            except pynvml.NVMLError_FunctionNotFound:
                self._missing.add(symbol)
            except pynvml.NVMLError_GpuIsLost as exc:
                raise _GpuLost(str(exc)) from None
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    # ----------------------------------------------------------------- per device
    def _read_device(self, dev: DeviceState, now: float) -> tuple[GpuInfo, tuple[GpuProcess, ...]]:
        if dev.lost:
            return GpuInfo(index=dev.index, lost=True, error=dev.error), ()
        try:
            if dev.identity is None:
                dev.identity = read_identity(self._nvml, self._get, self._raw, dev.handle, self.omit)
            if dev.slow is None or now - dev.slow_at >= self.slow_ttl:
                dev.slow, dev.slow_at = read_slow(self._nvml, self._get, dev.handle, self.omit), now
            if dev.fast is None or now - dev.fast_at >= self.fast_ttl:
                dev.fast = read_fast(self._nvml, self._get, dev.handle)
                mig = bool(dev.slow.get("mig_mode"))
                dev.processes = self._read_processes(dev, mig)
                dev.fast_at = now
        except _GpuLost as exc:
            dev.lost, dev.error = True, str(exc)
            dev.identity = dev.slow = dev.fast = None
            dev.processes = ()
            return GpuInfo(index=dev.index, lost=True, error=dev.error), ()
        return GpuInfo(index=dev.index, **dev.identity, **dev.slow, **dev.fast), dev.processes

    # ----------------------------------------------------------------- processes
    def _read_processes(self, dev: DeviceState, mig: bool) -> tuple[GpuProcess, ...]:
        compute = self._process_list(dev, "Compute")
        graphics = self._process_list(dev, "Graphics")
        if not compute and not graphics:
            return ()
        return gpu_processes(dev.index, compute, graphics, mig, self._utilization(dev, mig))

    def _utilization(self, dev: DeviceState, mig: bool) -> dict[int, tuple[int, int]] | None:
        """pid -> (SM %, memory-bandwidth %) of the processes the driver sampled as busy lately (the
        others are idle: 0); None when the GPU does not sample processes (MIG, many consumer boards,
        an error): N/A."""
        if mig or not dev.util_supported or "process_utilization" in self.omit:
            return None  # known N/A: no call
        pynvml = self._nvml

        def read() -> dict[int, tuple[int, int]]:
            try:
                since = self._wall_clock() - PROCESS_SAMPLE_WINDOW_S
                return read_utilization_samples(pynvml, dev, since, self._count_call)
            except pynvml.NVMLError_NotFound:  # no sample since the last read: nothing was busy
                return {}
            except pynvml.NVMLError_NotSupported:
                dev.util_supported = False  # a board's support does not change while we run
                raise

        latest: dict[int, tuple[int, int]] | None = self._get(("nvmlDeviceGetProcessUtilization", read))
        return latest

    def _process_list(self, dev: DeviceState, kind: str) -> list[ProcessEntry]:
        pynvml = self._nvml
        base = f"nvmlDeviceGet{kind}RunningProcesses"
        v2 = pynvml.c_nvmlProcessInfo_v2_t
        v3 = getattr(pynvml, "c_nvmlProcessInfo_v3_t", None) or v2
        count = self._count_call
        entries = self._get(
            (f"{base}_v3", lambda: read_process_list(pynvml, dev, f"{base}_v3", v3, count)),
            (f"{base}_v2", lambda: read_process_list(pynvml, dev, f"{base}_v2", v2, count)),
            (base, lambda: read_process_list(pynvml, dev, base, ProcessInfoV1, count)),
        )
        return entries or []


__all__ = [
    "BINDINGS_MISSING_REASON",
    "CLOSED_REASON",
    "LIBRARY_MISSING_REASON",
    "OMITTABLE_FIELDS",
    "VIEW_ONLY_FIELDS",
    "NvmlReading",
    "NvmlSource",
    "format_cuda_version",
]
