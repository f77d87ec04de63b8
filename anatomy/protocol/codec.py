"""The wire's codec: a message to one framed line and back, with every field validated against the
bounds (:mod:`anatomy.protocol.bounds`) on the way in. Stdlib only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from anatomy.protocol.bounds import (
    MAX_BATCH_DIMS,
    MAX_BYTES,
    MAX_BYTES_PER_PARAM,
    MAX_CONFIG_CHARS,
    MAX_EPOCH_S,
    MAX_FLOAT,
    MAX_INT,
    MAX_LORA_RANK,
    MAX_LORA_TARGETS,
    MAX_MESSAGE_BYTES,
    MAX_MFU,
    MAX_MODEL_NAME,
    MAX_OTHER_MODELS,
    MAX_RATE,
    MAX_SECONDS,
    MAX_SPEED_FACTOR,
    MAX_STRING_CHARS,
    MAX_SUGGESTIONS,
    MAX_TFLOPS,
    WEIGHT_QUANTIZATIONS,
    ProtocolError,
)
from anatomy.protocol.messages import (
    READABLE_VERSIONS,
    Busy,
    CudaMemory,
    Hello,
    LoraAdapter,
    Message,
    OpGroupStat,
    Snapshot,
    Suggestion,
    Timing,
)
from anatomy.vocabulary import Component, MemorySource, OpGroup, OptimizerKind, Phase, Precision, Source, Word


def to_dict(msg: Message) -> dict[str, Any]:
    """The message as plain JSON-ready values (what ``dataclasses.asdict`` gives, keys and values kept as
    they are). Not ``asdict``: it deep-copies each vocabulary member it meets, which doubled the cost of
    encoding a snapshot keyed by members on the publisher's thread."""
    out: dict[str, Any] = _plain(msg)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if hasattr(type(value), "__dataclass_fields__"):
        return {name: _plain(getattr(value, name)) for name in type(value).__dataclass_fields__}
    return value


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
    if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
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
        precision=_word(Precision, _req(d, "precision", str)),
        optimizer=_word(OptimizerKind, _req(d, "optimizer", str)),
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
        target_shape=_shape(d, "target_shape"),
        lora=_lora(d),
    )


def _lora(d: Mapping[str, Any]) -> LoraAdapter | None:
    raw = _req(d, "lora", dict, nullable=True)
    if raw is None:
        return None
    rank = _req(raw, "rank", int)
    if not 1 <= rank <= MAX_LORA_RANK:
        raise ProtocolError(f"lora: rank {rank} is outside 1..{MAX_LORA_RANK}")
    targets = _req(raw, "target_modules", (list, tuple))
    if not 1 <= len(targets) <= MAX_LORA_TARGETS:
        raise ProtocolError(f"lora: 1 to {MAX_LORA_TARGETS} target modules")
    if not all(isinstance(t, str) and 0 < len(t) <= MAX_MODEL_NAME for t in targets):
        raise ProtocolError("lora: a target module is not a short name")
    dropout = _opt_num(raw, "dropout", 1.0) or 0.0
    if dropout >= 1.0:
        raise ProtocolError("lora: dropout is not below 1")
    base = _req(raw, "base_model_class", str, nullable=True) or ""
    if len(base) > MAX_MODEL_NAME:
        raise ProtocolError("lora: base_model_class is not a short name")
    return LoraAdapter(rank=rank, target_modules=tuple(targets), dropout=dropout, base_model_class=base)


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


# Decode hands back the members it validates, never their strings: value -> member.
_COMPONENTS = {c.value: c for c in Component}
_OPGROUPS = {g.value: g for g in OpGroup}
_PHASES = {p.value: p for p in Phase}
_COMPONENT_KEYS = set(_COMPONENTS)
_OPGROUP_KEYS = set(_OPGROUPS)

_W = TypeVar("_W", bound=Word)


def _word(kind: type[_W], value: str) -> _W | str:
    """The member a known word names; an unknown one (a newer hook's precision, say) stays its string,
    as decode never refused it."""
    try:
        return kind(value)
    except ValueError:
        return value


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
    memory: dict[Component, int | None] = {_COMPONENTS[k]: _bytes(memory_raw, k) for k in memory_raw}
    at_peak_raw = _keyed(d, "at_peak", _COMPONENT_KEYS, nullable=True)
    at_peak: dict[Component, int | None] | None = None
    if at_peak_raw is not None:
        at_peak = {_COMPONENTS[k]: _bytes(at_peak_raw, k) for k in at_peak_raw}
    expected_raw = _keyed(d, "expected_bytes_per_param", _COMPONENT_KEYS) or {}
    expected: dict[Component, float | None] = {
        _COMPONENTS[k]: _opt_num(expected_raw, k, MAX_BYTES_PER_PARAM) for k in expected_raw
    }
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
    groups: dict[OpGroup, OpGroupStat] | None = None
    if groups_raw is not None:
        groups = {}
        for k, v in groups_raw.items():
            if not isinstance(v, dict):
                raise ProtocolError(f"op_groups[{k!r}] is not an object")
            flops, time_s = _opt_num(v, "flops"), _opt_num(v, "time_s", MAX_SECONDS)
            groups[_OPGROUPS[k]] = OpGroupStat(flops=flops, time_s=time_s)
    phase_raw = _req(d, "peak_phase", str, nullable=True)
    phase = None if phase_raw is None else _PHASES.get(phase_raw)
    if phase_raw is not None and phase is None:
        raise ProtocolError(f"unknown peak_phase {phase_raw!r}")
    suggestions_raw = _req(d, "suggestions", list, nullable=True) or []
    if len(suggestions_raw) > MAX_SUGGESTIONS:
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
                source=_word(Source, _req(s, "source", str)),
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
        memory_source=_word(MemorySource, _req(d, "memory_source", str, nullable=True) or "none"),
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
        sums_step=_req(d, "sums_step", int, nullable=True),
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
