"""The wire protocol between the training-side hook and the monitor. Stdlib only.

Transport: one Unix domain stream socket per training process, in a private runtime directory.
Framing: newline-delimited JSON, one object per line, at most MAX_MESSAGE_BYTES per line.
The server (the hook) sends a ``hello`` first, then ``snapshot`` messages (latest only, at most one
per publish interval). Readers send nothing; anything a reader sends is ignored.

Version rule: a reader accepts a message whose ``protocol`` is one of READABLE_VERSIONS and
ignores fields it does not know; a new required field means a new version. Version 2 added the
optional components (runtime, unsharded_parameters, inputs, communication_buffers) and the hello's
``run_id``/``local_world_size``; a version 1 message is a valid version 2 message. Version 3 added the
``other_models`` component (a reader of version 2 would reject the unknown component name, so it refuses
the version instead) and the optional ``trainable_parameter_count``, ``weight_quantization`` and
``other_models`` hello fields; a version 1 or 2 message is a valid version 3 message.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import socket
import stat
import struct
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The hook and the monitor name the runtime directory through this module.
from anatomy.rundir import runtime_dir as runtime_dir
from anatomy.rundir import untrusted_reason as untrusted_reason
from anatomy.vocabulary import Component, OpGroup, Phase

PROTOCOL_VERSION = 3
READABLE_VERSIONS = frozenset({1, 2, 3})
WEIGHT_QUANTIZATIONS = frozenset({"nf4", "fp4", "int8"})
MAX_OTHER_MODELS = 32  # named other models in a hello (a teacher, a reference model, an EMA copy ...)
MAX_MODEL_NAME = 128
MAX_MESSAGE_BYTES = 256 * 1024
# Physical bounds, checked at decode so that no view ever formats a number it cannot hold (a valid JSON
# integer may have 4,300 digits; 1e309 would overflow every float conversion downstream).
MAX_INT = 2**62
MAX_BYTES = 2**56  # 64 PiB: more memory than any process holds
MAX_FLOAT = 1e30
MAX_SECONDS = 1e7  # a step, a phase, an op group: under four months
MAX_EPOCH_S = 1e11  # a wall-clock time: before the year 5000
MAX_RATE = 1e15  # samples or tokens per second
MAX_TFLOPS = 1e9
MAX_MFU = 10.0  # a ratio; above 1 only when a GPU's peak is mis-tabled, never 10x
MAX_BYTES_PER_PARAM = 1e6
MAX_SPEED_FACTOR = 1e3
# A reader's poll takes at most this much from one socket, so a flooding peer cannot stall a monitor:
# the rest waits for the next poll (only the latest snapshot matters anyway).
POLL_BUDGET_BYTES = 4 * MAX_MESSAGE_BYTES
MAX_CONFIG_CHARS = 32 * 1024  # a hello's model_config: a large config (id2label of 20k labels) is left out
MAX_BATCH_DIMS = 8
POLL_BUDGET_S = 0.025
SOCKET_SUFFIX = ".sock"
OOM_SUFFIX = ".oom.json"
_NAME_RE = re.compile(r"^anatomy-(\d+)(?:-([A-Za-z0-9_.]+))?$")


class ProtocolError(ValueError):
    """A message that is malformed, oversize, of another protocol version, or fails validation."""


# ---------------------------------------------------------------------------------------------
# Runtime directory and socket names


def socket_name(pid: int, tag: str | None = None) -> str:
    """``anatomy-<pid>[-<tag>].sock``: the PID is recoverable from the name alone."""
    return f"anatomy-{pid}{'-' + tag if tag else ''}{SOCKET_SUFFIX}"


def pid_from_path(path: Path | str) -> int | None:
    name = Path(path).name
    for suffix in (SOCKET_SUFFIX, OOM_SUFFIX):
        if name.endswith(suffix):
            m = _NAME_RE.match(name[: -len(suffix)])
            return int(m.group(1)) if m else None
    return None


def oom_path(directory: Path, pid: int) -> Path:
    return directory / f"anatomy-{pid}{OOM_SUFFIX}"


def pid_alive(pid: int) -> bool:
    if pid <= 0:  # os.kill(0, ...) addresses our own process group
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listening(path: Path) -> bool:
    """Whether something accepts connections on the socket file (refused at once when nothing does)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.05)
    try:
        sock.connect(str(path))
        return True
    except (BlockingIOError, TimeoutError):
        return True  # a full backlog: someone is listening
    except OSError:
        return False
    finally:
        sock.close()


def discover(directory: Path | None = None, clean_stale: bool = True) -> list[Path]:
    """Sockets of live training processes, sorted by PID. Only sockets count (a file, FIFO or link with
    a socket's name is ignored). Sockets whose process is gone are removed when ``clean_stale`` (a hook
    killed with SIGKILL cannot remove its own), and only when they belong to this user. A socket whose
    PID is not ours to see but which still accepts connections (another PID namespace) is kept."""
    directory = directory if directory is not None else runtime_dir()
    found: list[tuple[int, Path]] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    euid = os.geteuid()
    for entry in entries:
        if not entry.name.endswith(SOCKET_SUFFIX):
            continue
        pid = pid_from_path(entry.name)
        if pid is None:
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISSOCK(st.st_mode):
            continue
        path = Path(entry.path)
        if not pid_alive(pid):
            if _listening(path):  # a live hook in another PID namespace (a container sharing the dir)
                found.append((pid, path))
                continue
            if clean_stale and st.st_uid == euid:
                with contextlib.suppress(OSError):
                    path.unlink()
            continue
        found.append((pid, path))
    return [p for _, p in sorted(found)]


def discover_oom(directory: Path | None = None) -> list[Path]:
    """Last-snapshot files written by hooks whose process died of out-of-memory (names only: what is
    behind a name is checked when it is read)."""
    directory = directory if directory is not None else runtime_dir()
    try:
        return sorted(p for p in directory.iterdir() if p.name.endswith(OOM_SUFFIX))
    except OSError:
        return []


# ---------------------------------------------------------------------------------------------
# Messages


@dataclass(frozen=True)
class Hello:
    pid: int
    host: str
    device: str  # "cpu", "cuda:0", ...
    precision: str  # a vocabulary.Precision value
    optimizer: str  # a vocabulary.OptimizerKind value
    model_class: str
    parameter_count: int
    torch_version: str
    started_at: float
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    dtype: str = "float32"  # the dtype of the parameters
    optimizer_class: str = ""
    # Optional, for the advisor (H6): tensor-core advice needs the GPU and the vocabulary size.
    device_name: str | None = None  # e.g. "NVIDIA A100-SXM4-80GB"; None on CPU / unknown
    device_memory_bytes: int | None = None  # total memory of the device
    vocab_size: int | None = None  # model.config.vocab_size when there is one
    tf32: bool | None = None  # torch.backends.cuda.matmul.allow_tf32 (or float32 matmul precision != highest)
    # The launcher's job identity (torchrun: TORCHELASTIC_RUN_ID): ranks of one job share it.
    run_id: str | None = None
    local_world_size: int | None = None
    # Version 3. Parameters that train (``requires_grad``): gradients and optimizer states are per these.
    # ``parameter_count`` is the logical total (a packed 4-bit weight counts its unpacked elements).
    trainable_parameter_count: int | None = None
    weight_quantization: str | None = None  # "nf4" | "fp4" | "int8" (bitsandbytes), None: not quantized
    other_models: dict[str, int] | None = None  # name -> bytes of each other model in the step
    # Optional, for `anatomy-top plan --like PID`: the model's Hugging Face config as JSON (its diff from
    # the defaults, at most MAX_CONFIG_CHARS) and the shape of the first batch tensor the model was fed.
    model_config: str | None = None
    batch_shape: tuple[int, ...] | None = None
    protocol: int = PROTOCOL_VERSION
    type: str = "hello"


@dataclass(frozen=True)
class CudaMemory:
    allocated: int
    reserved: int
    peak_allocated: int  # peak within the last step
    alloc_retries: int
    ooms: int
    # CUDA managed memory the hook can name (bitsandbytes' paged optimizer states), outside the allocator;
    # optional on the wire (an older hook sends none), so no protocol version change
    managed: int = 0


@dataclass(frozen=True)
class Timing:
    step_s: float | None = None
    forward_s: float | None = None
    backward_s: float | None = None
    optimizer_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None


@dataclass(frozen=True)
class OpGroupStat:
    flops: float | None  # per step
    time_s: float | None  # per step (device time on CUDA)


@dataclass(frozen=True)
class Suggestion:
    """One advisor line. ``saving_bytes`` is what the technique would save at the peak."""

    rule: str
    title: str
    detail: str
    source: str  # a vocabulary.Source value
    saving_bytes: int | None = None
    speed_factor: float | None = None


@dataclass(frozen=True)
class Snapshot:
    pid: int
    seq: int
    time: float
    step: int
    # Component value -> bytes; None means unmeasured on this platform (never 0 for unknown).
    memory: dict[str, int | None]
    # Component value -> bytes/param the guide expects for this set-up (None: no guide figure).
    expected_bytes_per_param: dict[str, float | None]
    parameter_count: int
    peak_bytes: int | None = None
    peak_phase: str | None = None  # a vocabulary.Phase value
    memory_source: str = "tensors"  # how temporaries were measured: cuda_allocator | glibc | none
    cuda: CudaMemory | None = None
    timing: Timing = field(default_factory=Timing)
    op_groups: dict[str, OpGroupStat] | None = None  # OpGroup value -> stat, from a sampled step
    op_groups_step: int | None = None  # which step the op groups were sampled on
    achieved_tflops: float | None = None
    mfu: float | None = None
    grad_accum_steps: int = 1
    suggestions: list[Suggestion] = field(default_factory=list)
    error: str | None = None  # the hook degraded: why
    oom: str | None = None  # set only in the last-snapshot file after an OOM
    batch_size: int | None = None  # samples per micro-batch (optional, for the advisor)
    # Optional (F1): Component value -> bytes held AT THE MOMENT of the step's peak (weights, optimizer
    # states, gradients, activations, temporaries, unattributed); they sum to ``peak_bytes`` exactly.
    # ``memory`` keeps each component at its own maximum. None: an older hook, or no peak measured.
    at_peak: dict[str, int | None] | None = None
    at_peak_step: int | None = None  # the step whose per-op trace gave the at-peak split
    trainable_parameter_count: int | None = None  # version 3: the divisor of gradients and optimizer states
    activations_step: int | None = None  # optional: the step whose saved tensors gave ``activations``
    protocol: int = PROTOCOL_VERSION
    type: str = "snapshot"


@dataclass(frozen=True)
class Busy:
    """Sent instead of a hello by a hook that already serves its limit of readers, just before it closes
    the connection: the reader says "busy" (not "exited") and tries again soon."""

    readers: int
    limit: int
    protocol: int = PROTOCOL_VERSION
    type: str = "busy"


Message = Hello | Snapshot | Busy


def to_dict(msg: Message) -> dict[str, Any]:
    return asdict(msg)


def encode(msg: Message, validate: bool = True) -> bytes:
    """One framed line. With ``validate`` (the default) the line is decoded again, so that whatever
    encode emits a reader accepts (an over-long string fails here, on the sender's side, with the
    sender's log line, rather than on every monitor)."""
    try:
        d = to_dict(msg)
        text = json.dumps(d, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:  # NaN/inf, or a value JSON cannot hold
        raise ProtocolError(f"message cannot be encoded: {exc}") from None
    data = text.encode() + b"\n"
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    if validate:
        from_dict(d)
    return data


# -- validation ---------------------------------------------------------------------------------


def _req(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], nullable: bool = False) -> Any:
    if key not in d:
        if nullable:
            return None
        raise ProtocolError(f"missing field {key!r}")
    value = d[key]
    if value is None and nullable:
        return None
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ProtocolError(f"field {key!r}: expected {kind}, got bool")
    if not isinstance(value, kind):
        raise ProtocolError(f"field {key!r}: expected {kind}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(f"field {key!r}: not finite")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise ProtocolError(f"field {key!r}: {str(value)[:20]}... is out of range")
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value < 0
        and key not in ("rank", "local_rank")
    ):
        raise ProtocolError(f"field {key!r}: negative")
    if isinstance(value, str) and len(value) > 4096:
        raise ProtocolError(f"field {key!r}: string too long")
    return value


_NUM = (int, float)


def _opt_num(d: Mapping[str, Any], key: str, limit: float = MAX_FLOAT) -> float | None:
    v = _req(d, key, _NUM, nullable=True)
    if v is None:
        return None
    if v < 0 or v > limit:  # times, rates, FLOPs, ratios, bytes per parameter: none is negative
        raise ProtocolError(f"field {key!r}: {v:.3g} is outside 0..{limit:g}")
    return float(v)


def _num(d: Mapping[str, Any], key: str, limit: float) -> float:
    v = _opt_num(d, key, limit)
    if v is None:
        raise ProtocolError(f"field {key!r}: null")
    return v


def _bytes(d: Mapping[str, Any], key: str, nullable: bool = True) -> int | None:
    v = _req(d, key, int, nullable=nullable)
    if v is not None and v > MAX_BYTES:
        raise ProtocolError(f"field {key!r}: {v} bytes is beyond {MAX_BYTES}")
    return v


def _hello_from(d: Mapping[str, Any]) -> Hello:
    return Hello(
        pid=_req(d, "pid", int),
        host=_req(d, "host", str),
        device=_req(d, "device", str),
        precision=_req(d, "precision", str),
        optimizer=_req(d, "optimizer", str),
        model_class=_req(d, "model_class", str),
        parameter_count=_req(d, "parameter_count", int),
        torch_version=_req(d, "torch_version", str),
        started_at=_num(d, "started_at", MAX_EPOCH_S),
        rank=_req(d, "rank", int, nullable=True),
        local_rank=_req(d, "local_rank", int, nullable=True),
        world_size=_req(d, "world_size", int, nullable=True),
        dtype=_req(d, "dtype", str, nullable=True) or "float32",
        optimizer_class=_req(d, "optimizer_class", str, nullable=True) or "",
        device_name=_req(d, "device_name", str, nullable=True),
        device_memory_bytes=_bytes(d, "device_memory_bytes"),
        vocab_size=_req(d, "vocab_size", int, nullable=True),
        tf32=_req(d, "tf32", bool, nullable=True),
        run_id=_req(d, "run_id", str, nullable=True),
        local_world_size=_req(d, "local_world_size", int, nullable=True),
        trainable_parameter_count=_req(d, "trainable_parameter_count", int, nullable=True),
        weight_quantization=_quantization(d),
        other_models=_other_models(d),
        model_config=_config_json(d),
        batch_shape=_shape(d, "batch_shape"),
    )


def _quantization(d: Mapping[str, Any]) -> str | None:
    value = _req(d, "weight_quantization", str, nullable=True)
    if value is not None and value not in WEIGHT_QUANTIZATIONS:
        raise ProtocolError(f"unknown weight_quantization {value[:20]!r}")
    return value


def _other_models(d: Mapping[str, Any]) -> dict[str, int] | None:
    raw = _req(d, "other_models", dict, nullable=True)
    if raw is None:
        return None
    if len(raw) > MAX_OTHER_MODELS:
        raise ProtocolError("too many other_models")
    out: dict[str, int] = {}
    for name in raw:
        if not isinstance(name, str) or len(name) > MAX_MODEL_NAME:
            raise ProtocolError("other_models: a name is not a short string")
        value = _bytes(raw, name, nullable=False)
        out[name] = value if value is not None else 0
    return out


def _config_json(d: Mapping[str, Any]) -> str | None:
    """A JSON object of at most MAX_CONFIG_CHARS (the only string longer than _req's bound)."""
    value = d.get("model_config")
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_CONFIG_CHARS:
        raise ProtocolError("field 'model_config': expected a JSON object of at most 32 KiB")
    try:
        parsed = json.loads(value)
    except ValueError:
        raise ProtocolError("field 'model_config': not JSON") from None
    if not isinstance(parsed, dict):
        raise ProtocolError("field 'model_config': not a JSON object")
    return value


def _shape(d: Mapping[str, Any], key: str) -> tuple[int, ...] | None:
    value = _req(d, key, (list, tuple), nullable=True)  # a list on the wire, a tuple when encoding
    if value is None:
        return None
    if len(value) > MAX_BATCH_DIMS:
        raise ProtocolError(f"field {key!r}: more than {MAX_BATCH_DIMS} dimensions")
    for v in value:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_INT:
            raise ProtocolError(f"field {key!r}: dimensions are whole numbers in 0..2**62")
    return tuple(value)


_COMPONENT_KEYS = {c.value for c in Component}
_OPGROUP_KEYS = {g.value for g in OpGroup}
_PHASE_KEYS = {p.value for p in Phase}


def _keyed(
    d: Mapping[str, Any], key: str, allowed: set[str], nullable: bool = False
) -> dict[str, Any] | None:
    value = _req(d, key, dict, nullable=nullable)
    if value is None:
        return None
    unknown = set(value) - allowed
    if unknown:
        raise ProtocolError(f"field {key!r}: unknown keys {sorted(unknown)}")
    return value


def _snapshot_from(d: Mapping[str, Any]) -> Snapshot:
    memory_raw = _keyed(d, "memory", _COMPONENT_KEYS) or {}
    memory = {k: _bytes(memory_raw, k) for k in memory_raw}
    at_peak_raw = _keyed(d, "at_peak", _COMPONENT_KEYS, nullable=True)
    at_peak = None
    if at_peak_raw is not None:
        at_peak = {k: _bytes(at_peak_raw, k) for k in at_peak_raw}
    expected_raw = _keyed(d, "expected_bytes_per_param", _COMPONENT_KEYS) or {}
    expected = {k: _opt_num(expected_raw, k, MAX_BYTES_PER_PARAM) for k in expected_raw}
    cuda_raw = _req(d, "cuda", dict, nullable=True)
    cuda = None
    if cuda_raw is not None:
        cuda = CudaMemory(
            **{k: _bytes(cuda_raw, k, nullable=k == "managed") or 0 for k in CudaMemory.__dataclass_fields__}
        )
    timing_raw = _req(d, "timing", dict, nullable=True) or {}
    timing = Timing(
        **{
            k: _opt_num(timing_raw, k, MAX_RATE if k.endswith("_per_s") else MAX_SECONDS)
            for k in Timing.__dataclass_fields__
        }
    )
    groups_raw = _keyed(d, "op_groups", _OPGROUP_KEYS, nullable=True)
    groups = None
    if groups_raw is not None:
        groups = {}
        for k, v in groups_raw.items():
            if not isinstance(v, dict):
                raise ProtocolError(f"op_groups[{k!r}] is not an object")
            groups[k] = OpGroupStat(flops=_opt_num(v, "flops"), time_s=_opt_num(v, "time_s", MAX_SECONDS))
    phase = _req(d, "peak_phase", str, nullable=True)
    if phase is not None and phase not in _PHASE_KEYS:
        raise ProtocolError(f"unknown peak_phase {phase!r}")
    suggestions_raw = _req(d, "suggestions", list, nullable=True) or []
    if len(suggestions_raw) > 64:
        raise ProtocolError("too many suggestions")
    suggestions = []
    for s in suggestions_raw:
        if not isinstance(s, dict):
            raise ProtocolError("suggestion is not an object")
        suggestions.append(
            Suggestion(
                rule=_req(s, "rule", str),
                title=_req(s, "title", str),
                detail=_req(s, "detail", str),
                source=_req(s, "source", str),
                saving_bytes=_bytes(s, "saving_bytes"),
                speed_factor=_opt_num(s, "speed_factor", MAX_SPEED_FACTOR),
            )
        )
    return Snapshot(
        pid=_req(d, "pid", int),
        seq=_req(d, "seq", int),
        time=_num(d, "time", MAX_EPOCH_S),
        step=_req(d, "step", int),
        memory=memory,
        expected_bytes_per_param=expected,
        parameter_count=_req(d, "parameter_count", int),
        peak_bytes=_bytes(d, "peak_bytes"),
        peak_phase=phase,
        memory_source=_req(d, "memory_source", str, nullable=True) or "none",
        cuda=cuda,
        timing=timing,
        op_groups=groups,
        op_groups_step=_req(d, "op_groups_step", int, nullable=True),
        achieved_tflops=_opt_num(d, "achieved_tflops", MAX_TFLOPS),
        mfu=_opt_num(d, "mfu", MAX_MFU),
        grad_accum_steps=_req(d, "grad_accum_steps", int, nullable=True) or 1,
        suggestions=suggestions,
        error=_req(d, "error", str, nullable=True),
        oom=_req(d, "oom", str, nullable=True),
        batch_size=_req(d, "batch_size", int, nullable=True),
        at_peak=at_peak,
        at_peak_step=_req(d, "at_peak_step", int, nullable=True),
        trainable_parameter_count=_req(d, "trainable_parameter_count", int, nullable=True),
        activations_step=_req(d, "activations_step", int, nullable=True),
    )


def from_dict(d: Any) -> Message:
    if not isinstance(d, dict):
        raise ProtocolError("message is not a JSON object")
    version = d.get("protocol")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ProtocolError("missing protocol version")
    if version not in READABLE_VERSIONS:
        raise ProtocolError(f"protocol version {version} (this reader speaks {sorted(READABLE_VERSIONS)})")
    kind = d.get("type")
    try:
        if kind == "hello":
            return _hello_from(d)
        if kind == "snapshot":
            return _snapshot_from(d)
        if kind == "busy":
            return Busy(readers=_req(d, "readers", int), limit=_req(d, "limit", int))
    except ProtocolError:
        raise
    except Exception as exc:  # whatever a hostile value makes a constructor do is still a bad message
        raise ProtocolError(f"invalid {kind} message: {type(exc).__name__}: {str(exc)[:200]}") from None
    raise ProtocolError(f"unknown message type {str(kind)[:40]!r}")


def decode(line: bytes) -> Message:
    """One message from one line; anything wrong with it, of any kind, is a ProtocolError."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(line)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        data = json.loads(line)
    except (ValueError, RecursionError, MemoryError) as exc:
        # ValueError covers bad UTF-8, bad JSON and integers past Python's digit limit;
        # RecursionError a deeply nested line: a hostile or broken peer must not crash the reader.
        raise ProtocolError(f"not JSON: {str(exc)[:200]}") from None
    return from_dict(data)


# ---------------------------------------------------------------------------------------------
# Reader


@dataclass(frozen=True)
class Peer:
    """Who serves a socket, in the kernel's words (``SO_PEERCRED``): its PID as this process's PID
    namespace numbers it (0 when the server lives where we cannot see), its uid and gid."""

    pid: int
    uid: int
    gid: int


_UCRED = struct.Struct("3i")


def peer_of(sock: socket.socket) -> Peer | None:
    """The credentials of a connected Unix socket's other end (None where the platform has none)."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size))
    except OSError:
        return None
    return Peer(pid, uid, gid)


class Reader:
    """A client of one hook socket. Non-blocking after connect: ``poll()`` drains what arrived (at most
    POLL_BUDGET_BYTES per call) and keeps the latest snapshot. Raises ProtocolError on anything
    invalid (then close it). ``peer``: who serves the socket, from the kernel."""

    def __init__(self, path: Path | str, timeout: float = 1.0) -> None:
        self.path = Path(path)
        self.pid = pid_from_path(self.path)
        self.hello: Hello | None = None
        self.snapshot: Snapshot | None = None
        self.busy: Busy | None = None
        self.closed = False
        self._buf = bytearray()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._connect(timeout)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self.peer = peer_of(self._sock)

    def _connect(self, timeout: float) -> None:
        # A Unix socket whose listen backlog is full refuses a non-blocking connect with EAGAIN
        # instead of queueing it (many monitors connecting at once): retry until the timeout.
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._sock.connect(str(self.path))
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def fileno(self) -> int:
        return self._sock.fileno()

    def _messages(self) -> Iterator[Message]:
        while True:
            nl = self._buf.find(b"\n")
            if nl < 0:
                if len(self._buf) > MAX_MESSAGE_BYTES:
                    raise ProtocolError(f"line longer than {MAX_MESSAGE_BYTES} bytes")
                return
            line = bytes(self._buf[:nl])
            del self._buf[: nl + 1]
            yield decode(line)

    def poll(self, budget_bytes: int = POLL_BUDGET_BYTES, budget_s: float = POLL_BUDGET_S) -> bool:
        """Read what is available, up to ``budget_bytes`` and for about ``budget_s``. Returns True if
        anything new arrived; on EOF sets closed. What a peer sends beyond the budget between two polls
        is read on later polls. Lines already buffered are decoded first: after a ProtocolError the
        next poll goes on with the line after the bad one, and the buffer never outgrows one budget."""
        got = self._drain()
        taken = 0
        deadline = time.monotonic() + budget_s
        while not self.closed and taken < budget_bytes and time.monotonic() < deadline:
            try:
                chunk = self._sock.recv(min(65536, budget_bytes - taken))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.closed = True
                break
            if not chunk:
                self.closed = True
                break
            taken += len(chunk)
            self._buf += chunk
            got = self._drain() or got
        return got

    @property
    def pending(self) -> bool:
        """A whole line is buffered, not decoded yet (left by a ProtocolError)."""
        return b"\n" in self._buf

    def _drain(self) -> bool:
        got = False
        for msg in self._messages():
            got = True
            if isinstance(msg, Busy):
                self.busy = msg
            elif isinstance(msg, Hello):
                self.hello = msg
            elif self.hello is None:
                raise ProtocolError("snapshot before hello")
            else:
                self.snapshot = msg
        return got

    def wait(self, timeout: float = 5.0, need_snapshot: bool = True) -> None:
        """Block until a hello (and a snapshot, if asked) arrived; for tests and `--once`."""
        import select

        deadline = time.monotonic() + timeout
        while not self.closed:
            self.poll()
            if self.hello is not None and (self.snapshot is not None or not need_snapshot):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {'snapshot' if self.hello else 'hello'} from {self.path}")
            select.select([self._sock], [], [], min(left, 0.1))
        if self.hello is None or (need_snapshot and self.snapshot is None):
            raise ConnectionError(f"{self.path} closed before sending a snapshot")

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_oom_file(directory: Path, hello: Hello, snapshot: Snapshot) -> Path:
    """Two lines, hello then the last snapshot (with ``oom`` set); written atomically, 0600. A failed
    write (a full disk) leaves nothing behind: no empty or partial file."""
    path = oom_path(directory, hello.pid)
    data = encode(hello) + encode(snapshot)  # before touching the disk: no half-written file
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(tmp.lstat().st_mode):
            raise FileExistsError(f"{tmp} exists and is not a regular file")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def read_small_file(path: Path | str, limit: int) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes. Never follows a link, never blocks on a
    FIFO or device, never reads more than ``limit + 1`` bytes: whatever was planted under the name."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ProtocolError(f"{path} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ProtocolError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise ProtocolError(f"{path} is larger than {limit} bytes")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ProtocolError(f"{path} is larger than {limit} bytes")
    return data


def read_oom_file(path: Path | str) -> tuple[Hello, Snapshot]:
    """The hello and last snapshot a hook wrote when its process died of out-of-memory."""
    raw = read_small_file(path, 2 * MAX_MESSAGE_BYTES)
    lines = [ln for ln in raw.split(b"\n") if ln.strip()]
    if len(lines) != 2:
        raise ProtocolError(f"{path} must hold a hello and a snapshot")
    hello, snap = decode(lines[0]), decode(lines[1])
    if not isinstance(hello, Hello) or not isinstance(snap, Snapshot):
        raise ProtocolError(f"{path} does not hold a hello then a snapshot")
    return hello, snap
