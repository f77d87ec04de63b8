"""Protocol version 3: the ``other_models`` component and the hello's trainable count, weight quantization
and other models — what a version 3 reader accepts, and what a version 2 reader (an older monitor) does."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from anatomy import protocol
from anatomy.protocol import Hello, ProtocolError, Snapshot, codec
from anatomy.vocabulary import OPTIONAL_COMPONENTS, Component


def _hello(**kw: object) -> Hello:
    fields: dict[str, object] = dict(
        pid=7,
        host="h",
        device="cpu",
        precision="fp32",
        optimizer="adamw",
        model_class="PeftModelForCausalLM",
        parameter_count=593_930,
        torch_version="2.13.0",
        started_at=1.0,
        trainable_parameter_count=8_192,
        weight_quantization="nf4",
        other_models={"teacher": 46_137_344, "ref_model": 0},
    )
    fields.update(kw)
    return Hello(**fields)  # type: ignore[arg-type]


def _snapshot() -> Snapshot:
    return Snapshot(
        pid=7,
        seq=1,
        time=2.0,
        step=1,
        memory={Component.WEIGHTS.value: 100, Component.OTHER_MODELS.value: 46_137_344},
        expected_bytes_per_param={Component.WEIGHTS.value: None},
        parameter_count=593_930,
        trainable_parameter_count=8_192,
        at_peak={Component.WEIGHTS.value: 100, Component.OTHER_MODELS.value: 46_137_344},
    )


def test_version_3_messages_round_trip() -> None:
    assert protocol.PROTOCOL_VERSION == 3
    for msg in (_hello(), _snapshot()):
        assert protocol.decode(protocol.encode(msg).rstrip(b"\n")) == msg
    assert Component.OTHER_MODELS in OPTIONAL_COMPONENTS  # a row only where a job has other models


def test_older_messages_are_still_read() -> None:
    for version in (1, 2):
        d = protocol.to_dict(_hello())
        for key in ("trainable_parameter_count", "weight_quantization", "other_models"):
            del d[key]
        d["protocol"] = version
        hello = protocol.decode(json.dumps(d).encode())
        assert isinstance(hello, Hello)
        assert hello.trainable_parameter_count is None and hello.weight_quantization is None
        assert hello.other_models is None


def test_a_version_2_reader_refuses_version_3(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older monitor reads versions 1 and 2 only: a version 3 publisher is a protocol error for that
    publisher (said in one line), never a component name it would misread."""
    line = protocol.encode(_snapshot()).rstrip(b"\n")
    # The decoder reads the versions it speaks where it lives, in the codec.
    monkeypatch.setattr(codec, "READABLE_VERSIONS", frozenset({1, 2}))
    with pytest.raises(ProtocolError, match=r"protocol version 3 \(this reader speaks \[1, 2\]\)"):
        protocol.decode(line)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("weight_quantization", "int3", "unknown weight_quantization"),
        ("weight_quantization", 4, "expected"),
        ("other_models", {"teacher": -1}, "negative"),
        ("other_models", {"teacher": 2**60}, "bytes is beyond"),
        ("other_models", {"teacher": "big"}, "expected"),
        ("other_models", {"x" * 200: 1}, "short string"),
        ("other_models", {f"m{i}": 1 for i in range(40)}, "too many"),
        ("other_models", [1, 2], "expected"),
        ("trainable_parameter_count", -3, "negative"),
    ],
)
def test_hostile_version_3_fields_are_rejected(field: str, value: object, match: str) -> None:
    d = protocol.to_dict(_hello())
    d[field] = value
    with pytest.raises(ProtocolError, match=match):
        protocol.decode(json.dumps(d).encode())


def test_encode_refuses_what_a_reader_would_reject() -> None:
    with pytest.raises(ProtocolError):
        protocol.encode(replace(_hello(), weight_quantization="q2"))
