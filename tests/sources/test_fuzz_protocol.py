"""Property-based fuzzing of the wire protocol (hypothesis, bounded for CI): whatever bytes a peer sends,
the decoder raises ProtocolError or returns a message whose every number is within physical bounds, and
every view of an accepted message renders without an exception. The reader's framing gives the same
messages however the bytes are cut. ``benchmarks/fuzz_reader.py`` runs the long version (10^6 messages)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anatomy import protocol
from anatomy.protocol import Hello, ProtocolError, Snapshot
from anatomy.vocabulary import Component, OpGroup
from tui.report.anatomy_json import training_json
from tui.report.anatomy_text import render_training_text
from tui.sources.anatomy_source import LIVE, TrainingProcess
from tui.sources.reconcile import reconcile

ME = os.getpid()

HELLO = Hello(
    pid=ME,
    host="box",
    device="cuda:0",
    precision="bf16_mixed",
    optimizer="adamw",
    model_class="M",
    parameter_count=10**6,
    torch_version="2.13.0",
    started_at=1.79e9,
    rank=0,
    world_size=2,
)
SNAPSHOT = Snapshot(
    pid=ME,
    seq=3,
    time=1.79e9,
    step=3,
    memory={c.value: 1000 * (i + 1) for i, c in enumerate(Component)},
    expected_bytes_per_param={Component.WEIGHTS.value: 2.0},
    parameter_count=10**6,
    peak_bytes=10**6,
    peak_phase="backward",
    cuda=protocol.CudaMemory(allocated=1, reserved=2, peak_allocated=3, alloc_retries=0, ooms=0),
    timing=protocol.Timing(step_s=0.5, forward_s=0.1, samples_per_s=10.0),
    op_groups={g.value: protocol.OpGroupStat(flops=1e9, time_s=0.1) for g in OpGroup},
    mfu=0.4,
    suggestions=[protocol.Suggestion(rule="r", title="t", detail="d", source="measured", saving_bytes=5)],
    at_peak={Component.WEIGHTS.value: 10**6},
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def _paths(d: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(d, dict):
        for k, v in d.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out += _paths(v, (*prefix, i))
    return out


BASE = {"hello": json.loads(protocol.encode(HELLO)), "snapshot": json.loads(protocol.encode(SNAPSHOT))}
PATHS = {kind: _paths(d) for kind, d in BASE.items()}


def _numbers(obj: Any) -> Iterator[float]:
    if isinstance(obj, bool):
        return
    if isinstance(obj, (int, float)):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _numbers(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _numbers(v)
    elif hasattr(obj, "__dataclass_fields__"):
        for name in obj.__dataclass_fields__:
            yield from _numbers(getattr(obj, name))


def _check_accepted(msg: Any) -> None:
    """An accepted message holds only finite numbers within bounds, and every view renders it."""
    for n in _numbers(msg):
        assert math.isfinite(n) and abs(n) <= protocol.MAX_INT
    if isinstance(msg, Snapshot):
        proc = TrainingProcess(pid=ME, hello=HELLO, snapshot=msg, state=LIVE)
        reconcile(HELLO, msg, 2 * 10**9)
        render_training_text([proc])
        json.dumps(training_json([proc]), allow_nan=False)
    elif isinstance(msg, Hello):
        proc = TrainingProcess(pid=ME, hello=msg, snapshot=SNAPSHOT, state=LIVE)
        render_training_text([proc])
        json.dumps(training_json([proc]), allow_nan=False)


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes_are_a_message_or_a_protocol_error(data: bytes) -> None:
    try:
        msg = protocol.decode(data)
    except ProtocolError:
        return
    _check_accepted(msg)


@FUZZ
@given(json_values)
def test_arbitrary_json_is_a_message_or_a_protocol_error(value: Any) -> None:
    try:
        line = json.dumps(value).encode()
    except (ValueError, OverflowError):
        return
    try:
        msg = protocol.decode(line)
    except ProtocolError:
        return
    _check_accepted(msg)


@FUZZ
@given(st.sampled_from(["hello", "snapshot"]), st.data())
def test_a_valid_message_with_one_field_replaced_is_a_message_or_a_protocol_error(
    kind: str, data: Any
) -> None:
    doc = json.loads(json.dumps(BASE[kind]))
    path = data.draw(st.sampled_from(PATHS[kind]))
    value = data.draw(json_values)
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    try:
        line = json.dumps(doc).encode()
    except (ValueError, OverflowError):
        return
    try:
        msg = protocol.decode(line)
    except ProtocolError:
        return
    _check_accepted(msg)


# -- the reader's framing ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fz-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _serve_once(path: Path, chunks: list[bytes]) -> threading.Thread:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def run() -> None:
        conn, _ = listener.accept()
        listener.close()
        with conn, contextlib.suppress(OSError):  # the reader hangs up after a bad message
            for chunk in chunks:
                conn.sendall(chunk)
                time.sleep(0.0005)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=40),
    st.lists(st.sampled_from(["good", "garbage", "long"]), min_size=1, max_size=4),
)
def test_framing_is_independent_of_how_the_bytes_are_cut(
    short_dir: Path, cuts: list[int], tail: list[str]
) -> None:
    stream = protocol.encode(HELLO) + protocol.encode(SNAPSHOT)
    extras = {
        "good": protocol.encode(SNAPSHOT),
        "garbage": b"\x00{not json\n",
        "long": b"x" * (protocol.MAX_MESSAGE_BYTES + 10),
    }
    for name in tail:
        stream += extras[name]
    chunks, at = [], 0
    for n in cuts:
        chunks.append(stream[at : at + n])
        at += n
    chunks.append(stream[at:])
    path = short_dir / f"anatomy-{ME}-fz{time.monotonic_ns()}.sock"
    thread = _serve_once(path, [c for c in chunks if c])
    reader = protocol.Reader(path)
    error: ProtocolError | None = None
    try:
        deadline = time.monotonic() + 10
        while not reader.closed and time.monotonic() < deadline:
            try:
                reader.poll()
            except ProtocolError as exc:  # the only exception a reader raises
                error = exc
                break
            time.sleep(0.001)
    finally:
        reader.close()
        thread.join(timeout=5)
        path.unlink(missing_ok=True)
    assert reader.hello == HELLO and reader.snapshot == SNAPSHOT
    bad = next((t for t in tail if t != "good"), None)
    assert (error is not None) == (bad is not None)
