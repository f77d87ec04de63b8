"""The wire speaks the typed vocabulary: a message built with members encodes to exactly the bytes of
the one built with their strings, and decode hands back the members it validates."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace

import pytest

from anatomy import protocol
from anatomy.protocol import CudaMemory, Hello, OpGroupStat, Snapshot, Suggestion, Timing
from anatomy.vocabulary import (
    Component,
    MemorySource,
    OpGroup,
    OptimizerKind,
    Phase,
    Precision,
    PublisherState,
    Source,
    TreeRole,
    Word,
)


def _hello(typed: bool) -> Hello:
    return Hello(
        pid=4242,
        host="node-1",
        device="cuda:0",
        precision=Precision.BF16_MIXED if typed else "bf16_mixed",
        optimizer=OptimizerKind.ADAMW if typed else "adamw",
        model_class="GPT2LMHeadModel",
        parameter_count=124_000_000,
        torch_version="2.13.0",
        started_at=1_700_000_000.5,
    )


def _snapshot(typed: bool) -> Snapshot:
    def key(c: Component | OpGroup) -> str:
        return c if typed else c.value

    return Snapshot(
        pid=4242,
        seq=3,
        time=1_700_000_100.25,
        step=30,
        memory={key(Component.WEIGHTS): 496_000_000, key(Component.TEMPORARIES): None},
        expected_bytes_per_param={key(Component.WEIGHTS): 6.0, key(Component.ACTIVATIONS): None},
        parameter_count=124_000_000,
        peak_bytes=3_000_000_000,
        peak_phase=Phase.BACKWARD if typed else "backward",
        memory_source=MemorySource.CUDA_ALLOCATOR if typed else "cuda_allocator",
        cuda=CudaMemory(allocated=1, reserved=2, peak_allocated=3, alloc_retries=0, ooms=0),
        timing=Timing(step_s=0.25),
        op_groups={key(OpGroup.CONTRACTION): OpGroupStat(flops=1e12, time_s=0.1)},
        suggestions=[Suggestion("r", "t", "d", Source.GUIDE if typed else "guide", saving_bytes=10)],
        at_peak={key(Component.WEIGHTS): 496_000_000, key(Component.GRADIENTS): 0},
    )


@pytest.mark.parametrize("make", [_hello, _snapshot])
def test_members_encode_to_the_bytes_of_their_strings(make: object) -> None:
    assert callable(make)
    typed, plain = protocol.encode(make(True)), protocol.encode(make(False))
    assert typed == plain
    assert b"Component." not in typed and b"Phase." not in typed and b"Precision." not in typed


def test_decode_hands_back_members_and_reencodes_byte_for_byte() -> None:
    line = protocol.encode(_snapshot(False))
    snap = protocol.decode(line)
    assert isinstance(snap, Snapshot)
    assert all(type(k) is Component for k in snap.memory)
    assert all(type(k) is Component for k in snap.expected_bytes_per_param)
    assert snap.at_peak is not None and all(type(k) is Component for k in snap.at_peak)
    assert snap.op_groups is not None and all(type(k) is OpGroup for k in snap.op_groups)
    assert snap.peak_phase is Phase.BACKWARD
    assert snap.memory_source is MemorySource.CUDA_ALLOCATOR
    assert snap.suggestions[0].source is Source.GUIDE
    # A member still answers a look-up by its string, and equals the plain-string message.
    assert snap.memory["weights"] == 496_000_000 and snap == _snapshot(False)
    assert protocol.encode(snap) == line
    hello = protocol.decode(protocol.encode(_hello(False)))
    assert isinstance(hello, Hello)
    assert hello.precision is Precision.BF16_MIXED and hello.optimizer is OptimizerKind.ADAMW


def test_a_word_decode_does_not_know_stays_a_string() -> None:
    """Precision, optimizer, memory source and suggestion source were never refused when unknown (a newer
    hook's word): they still are not, and stay plain strings."""
    d = protocol.to_dict(replace(_hello(False), precision="fp8_mixed", optimizer="lion"))
    hello = protocol.decode(json.dumps(d).encode())
    assert isinstance(hello, Hello)
    assert type(hello.precision) is str and hello.precision == "fp8_mixed"
    assert type(hello.optimizer) is str and hello.optimizer == "lion"
    d = protocol.to_dict(replace(_snapshot(False), memory_source="pinned"))
    snap = protocol.decode(json.dumps(d).encode())
    assert isinstance(snap, Snapshot) and type(snap.memory_source) is str and snap.memory_source == "pinned"


def test_a_missing_memory_source_still_reads_as_none() -> None:
    d = protocol.to_dict(_snapshot(False))
    del d["memory_source"]
    snap = protocol.decode(json.dumps(d).encode())
    assert isinstance(snap, Snapshot) and snap.memory_source is MemorySource.NONE


@pytest.mark.parametrize(
    "member",
    [Component.WEIGHTS, OpGroup.CONTRACTION, Phase.FORWARD, Precision.FP32, PublisherState.OOM, TreeRole.GPU],
)
def test_a_word_prints_and_formats_as_its_value(member: Word) -> None:
    """Views format what decode returns (" in {peak_phase}"): a member must read as the string it replaced."""
    assert str(member) == member.value
    assert f"{member}" == member.value and f"{member:>12}" == f"{member.value:>12}"
    assert json.dumps({member: member}) == json.dumps({member.value: member.value})


def test_the_state_and_role_words_are_the_strings_in_use() -> None:
    assert [s.value for s in PublisherState] == ["live", "oom", "exited", "error"]
    assert [r.value for r in TreeRole] == ["gpu", "ancestor", "child"]
    assert MemorySource.TENSORS == "tensors" and Snapshot(0, 0, 0.0, 0, {}, {}, 0).memory_source == "tensors"


def _plain(value: object) -> object:
    """``value`` with every vocabulary member (keys, values, nested messages) its plain string."""
    if isinstance(value, Word):
        return str.__str__(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return replace(value, **fields)  # type: ignore[type-var]
    return value


def test_the_hook_builds_its_messages_with_members_and_they_encode_as_their_strings() -> None:
    """The tracker keys a snapshot's maps by Component and OpGroup and names the peak's phase, the memory
    source and the hello's precision by members; each message encodes to the bytes of its all-string twin."""
    import torch

    import anatomy

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32)
    with anatomy.track(model, opt, publish=False, sample_every=2, interval_s=0.0) as tracker:
        for _ in range(4):  # step 1 sampled: op groups and the traced split at the peak
            with tracker.step():
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
        snaps, hello = list(tracker.history), tracker.hello
    assert type(hello.precision) is Precision and type(hello.optimizer) is OptimizerKind
    last = snaps[-1]
    assert last.op_groups is not None and last.at_peak is not None
    assert {type(k) for k in (*last.memory, *last.expected_bytes_per_param, *last.at_peak)} == {Component}
    assert {type(k) for k in last.op_groups} == {OpGroup}
    assert type(last.peak_phase) is Phase and type(last.memory_source) is MemorySource
    for msg in (hello, *snaps):
        assert protocol.encode(msg) == protocol.encode(_plain(msg))  # type: ignore[arg-type]
