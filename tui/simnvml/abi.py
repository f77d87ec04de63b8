"""The NVML C ABI as the simulated library sees it: return codes, enums and struct layouts.

Written from nvml.h's semantics, independently of pynvml's own struct classes, so that tests which
read our answers through pynvml check that both sides agree on the layout (as with a real driver).
"""

from __future__ import annotations

import ctypes
from enum import IntEnum


class Return(IntEnum):
    """``nvmlReturn_t``."""

    SUCCESS = 0
    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    ALREADY_INITIALIZED = 5
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    INSUFFICIENT_POWER = 8
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    IRQ_ISSUE = 11
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    CORRUPTED_INFOROM = 14
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    OPERATING_SYSTEM = 17
    LIB_RM_VERSION_MISMATCH = 18
    IN_USE = 19
    MEMORY = 20
    NO_DATA = 21
    VGPU_ECC_NOT_SUPPORTED = 22
    INSUFFICIENT_RESOURCES = 23
    FREQ_NOT_SUPPORTED = 24
    ARGUMENT_VERSION_MISMATCH = 25
    DEPRECATED = 26
    NOT_READY = 27
    GPU_NOT_FOUND = 28
    INVALID_STATE = 29
    UNKNOWN = 999


ERROR_STRINGS: dict[int, str] = {
    Return.SUCCESS: "Success",
    Return.UNINITIALIZED: "Uninitialized",
    Return.INVALID_ARGUMENT: "Invalid Argument",
    Return.NOT_SUPPORTED: "Not Supported",
    Return.NO_PERMISSION: "Insufficient Permissions",
    Return.ALREADY_INITIALIZED: "Already Initialized",
    Return.NOT_FOUND: "Not Found",
    Return.INSUFFICIENT_SIZE: "Insufficient Size",
    Return.INSUFFICIENT_POWER: "Insufficient External Power",
    Return.DRIVER_NOT_LOADED: "Driver Not Loaded",
    Return.TIMEOUT: "Timeout",
    Return.IRQ_ISSUE: "Interrupt Request Issue",
    Return.LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    Return.FUNCTION_NOT_FOUND: "Function Not Found",
    Return.CORRUPTED_INFOROM: "Corrupted infoROM",
    Return.GPU_IS_LOST: "GPU is lost",
    Return.RESET_REQUIRED: "GPU requires restart",
    Return.OPERATING_SYSTEM: "The operating system has blocked the request.",
    Return.LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    Return.IN_USE: "In use by another client",
    Return.MEMORY: "Insufficient Memory",
    Return.NO_DATA: "No data",
    Return.ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
    Return.NOT_READY: "Not ready",
    Return.GPU_NOT_FOUND: "GPU not found",
    Return.INVALID_STATE: "Invalid state",
    Return.UNKNOWN: "Unknown Error",
}

# Enumerations (nvml.h values).
ENABLED = 1
DISABLED = 0
COMPUTE_MODES = {"Default": 0, "Prohibited": 2, "Exclusive_Process": 3}
BRAND_NVIDIA = 14
ARCH_HOPPER = 9
ARCHITECTURES = {"Kepler": 2, "Maxwell": 3, "Pascal": 4, "Volta": 5, "Turing": 6, "Ampere": 7, "Ada": 8,
                 "Hopper": 9, "Blackwell": 10}  # fmt: skip
CLOCK_GRAPHICS, CLOCK_SM, CLOCK_MEM, CLOCK_VIDEO = 0, 1, 2, 3
TEMPERATURE_GPU = 0
THRESHOLD_SHUTDOWN, THRESHOLD_SLOWDOWN, THRESHOLD_MEM_MAX, THRESHOLD_GPU_MAX = 0, 1, 2, 3
MEMORY_ERROR_CORRECTED, MEMORY_ERROR_UNCORRECTED = 0, 1
VOLATILE_ECC, AGGREGATE_ECC = 0, 1
PCIE_UTIL_TX, PCIE_UTIL_RX = 0, 1
INFOROM_OEM, INFOROM_ECC, INFOROM_POWER = 0, 1, 2
INVALID_INSTANCE_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId when MIG is off
CLOCKS_EVENT_REASON_GPU_IDLE = 0x1
CLOCKS_EVENT_REASON_SW_POWER_CAP = 0x4


def struct_version(struct: type[ctypes.Structure], ver: int) -> int:
    """nvml.h's NVML_STRUCT_VERSION: ``sizeof(struct) | (ver << 24)``."""
    return ctypes.sizeof(struct) | (ver << 24)


class PciInfo(ctypes.Structure):
    """``nvmlPciInfo_t`` since v3 (nvmlDeviceGetPciInfo_v3): legacy and full-width bus ids."""

    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class PciInfoV1(ctypes.Structure):
    """The pre-v3 ``nvmlPciInfo_t`` of nvmlDeviceGetPciInfo and _v2: a 16-byte busId, reserved words."""

    _fields_ = [
        ("busId", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint),
        ("reserved2", ctypes.c_uint),
        ("reserved3", ctypes.c_uint),
    ]


class PciInfoExtV1(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("baseClass", ctypes.c_uint),
        ("subClass", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class MemoryV1(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class MemoryV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class Bar1Memory(ctypes.Structure):
    _fields_ = [
        ("bar1Total", ctypes.c_ulonglong),
        ("bar1Free", ctypes.c_ulonglong),
        ("bar1Used", ctypes.c_ulonglong),
    ]


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class ProcessInfoV2(ctypes.Structure):
    """``nvmlProcessInfo_v2_t``; the released v3 layout is identical."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class ProcessDetailV1(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
        ("usedGpuCcProtectedMemory", ctypes.c_ulonglong),
    ]


class ProcessDetailListV1(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("mode", ctypes.c_uint),  # 0 compute, 1 graphics, 2 MPS
        ("numProcArrayEntries", ctypes.c_uint),
        ("procArray", ctypes.POINTER(ProcessDetailV1)),
    ]


class TemperatureV1(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("sensorType", ctypes.c_uint), ("temperature", ctypes.c_int)]


class FanSpeedInfoV1(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("fan", ctypes.c_uint), ("speed", ctypes.c_uint)]


class ProcessUtilizationSample(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("timeStamp", ctypes.c_ulonglong),
        ("smUtil", ctypes.c_uint),
        ("memUtil", ctypes.c_uint),
        ("encUtil", ctypes.c_uint),
        ("decUtil", ctypes.c_uint),
    ]


class Value(ctypes.Union):
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class FieldValue(ctypes.Structure):
    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", Value),
    ]


MEMORY_V2_VERSION = struct_version(MemoryV2, 2)
TEMPERATURE_V1_VERSION = struct_version(TemperatureV1, 1)
FAN_SPEED_INFO_V1_VERSION = struct_version(FanSpeedInfoV1, 1)
PCI_INFO_EXT_V1_VERSION = struct_version(PciInfoExtV1, 1)
PROCESS_DETAIL_LIST_V1_VERSION = struct_version(ProcessDetailListV1, 1)
