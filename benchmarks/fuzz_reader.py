"""The long fuzz run of the monitor's reader (issue 12): N malformed messages (default 10^6) through a real
Unix socket into a real ``protocol.Reader``, in the framing a hook uses, each a valid hello or snapshot
mutated one way (bytes flipped, cut, inserted; a field replaced by a huge, negative, NaN-like, nested or
wrong-typed value). Reported: exceptions other than ProtocolError out of ``poll()`` (goal 0), accepted
messages that break a view (goal 0), the slowest poll against its budget, and the reader's RSS at the
start, middle and end (goal: flat). The baseline in the same run: the same reader and stream with the
unmutated messages (polls' cost without the fuzz).

  .venv/bin/python benchmarks/fuzz_reader.py [--messages 1000000] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from anatomy import protocol
from anatomy.protocol import CudaMemory, Hello, OpGroupStat, ProtocolError, Snapshot, Suggestion, Timing
from anatomy.vocabulary import Component, OpGroup
from tui.report.anatomy_text import render_training_text
from tui.sources.anatomy_source import LIVE, TrainingProcess

HELLO = Hello(
    pid=os.getpid(),
    host="box",
    device="cuda:0",
    precision="bf16_mixed",
    optimizer="adamw",
    model_class="LlamaForCausalLM",
    parameter_count=7 * 10**9,
    torch_version="2.13.0",
    started_at=time.time(),
    rank=0,
    world_size=8,
)
SNAPSHOT = Snapshot(
    pid=os.getpid(),
    seq=1,
    time=time.time(),
    step=1,
    memory={c.value: 10**9 + i for i, c in enumerate(Component)},
    expected_bytes_per_param={Component.WEIGHTS.value: 2.0},
    parameter_count=7 * 10**9,
    peak_bytes=4 * 10**10,
    peak_phase="backward",
    cuda=CudaMemory(allocated=1, reserved=2, peak_allocated=3, alloc_retries=0, ooms=0),
    timing=Timing(step_s=0.5, forward_s=0.1, backward_s=0.3, optimizer_s=0.1, samples_per_s=16.0),
    op_groups={g.value: OpGroupStat(flops=1e12, time_s=0.1) for g in OpGroup},
    mfu=0.41,
    suggestions=[Suggestion(rule="r", title="Gradient checkpointing", detail="d", source="measured")],
)
VALUES: list[object] = [
    10**400,
    -(10**30),
    2**57,
    1e308,
    -1.0,
    0,
    "",
    "x" * 5000,
    [],
    {},
    None,
    True,
    [[[[]]]],
    {"a": {"b": 1}},
]


def rss_kib() -> int:
    """Resident memory now (not the peak: a peak never comes down, so it cannot show a leak's slope)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def mutate(rng: random.Random, base: dict[str, object], line: bytes) -> bytes:
    """One malformed message (without its newline)."""
    kind = rng.randrange(6)
    if kind == 0:  # flip bytes
        data = bytearray(line)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data).replace(b"\n", b" ")
    if kind == 1:  # cut
        return line[: rng.randrange(len(line))]
    if kind == 2:  # insert
        at = rng.randrange(len(line))
        return line[:at] + rng.choice([b"{", b"]", b'"', b"\\u0000", b"1e999", b"9" * 500]) + line[at:]
    doc = json.loads(line)
    keys = list(doc)
    key = rng.choice(keys)
    if kind == 3:  # a top-level field replaced
        doc[key] = rng.choice(VALUES)
    elif kind == 4 and isinstance(doc.get("memory"), dict):  # a component's bytes replaced
        doc["memory"][rng.choice(list(doc["memory"]))] = rng.choice(VALUES)
    else:  # a field removed, or an unknown one added
        if rng.random() < 0.5:
            doc.pop(key)
        else:
            doc[f"x{rng.randrange(100)}"] = rng.choice(VALUES)
    try:
        return json.dumps(doc).encode()
    except (ValueError, OverflowError):
        return b"{}"


def run(
    messages: int, seed: int, stream: Callable[[random.Random, int], bytes], label: str
) -> dict[str, float]:
    rng = random.Random(seed)
    directory = Path(tempfile.mkdtemp(prefix="fz-", dir="/tmp"))
    path = directory / protocol.socket_name(os.getpid())
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    batch = 1000

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(protocol.encode(HELLO))
            for start in range(0, messages, batch):
                conn.sendall(stream(rng, min(batch, messages - start)))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    reader = protocol.Reader(path)
    polls: list[float] = []  # every 64th poll's duration (all of them would grow the RSS measured here)
    n_polls = 0
    worst = 0.0
    rss: list[int] = []
    errors = other = view_failures = accepted = 0
    last_seen = None
    t0 = time.perf_counter()
    while not reader.closed or reader.pending:
        start = time.perf_counter()
        try:
            reader.poll()
        except ProtocolError:
            errors += 1
        except Exception as exc:  # the finding this run looks for
            other += 1
            print(f"  non-protocol exception: {type(exc).__name__}: {exc}", file=sys.stderr)
        took = time.perf_counter() - start
        worst = max(worst, took)
        n_polls += 1
        if n_polls % 64 == 0:
            polls.append(took)
        snap = reader.snapshot
        if snap is not None and snap is not last_seen:
            last_seen = snap
            accepted += 1
            try:
                render_training_text([TrainingProcess(pid=1, hello=reader.hello, snapshot=snap, state=LIVE)])
            except Exception:
                view_failures += 1
        if n_polls % 100_000 == 0:
            rss.append(rss_kib())
    elapsed = time.perf_counter() - t0
    thread.join()
    reader.close()
    listener.close()
    shutil.rmtree(directory, ignore_errors=True)
    rss.append(rss_kib())
    print(
        f"{label:<10} {messages:>9,} messages in {elapsed:6.1f} s: {errors:,} ProtocolError, {other} other "
        f"exceptions, {accepted:,} accepted ({view_failures} broke a view); polls {n_polls:,}, median "
        f"{statistics.median(polls) * 1e3:.2f} ms, worst {worst * 1e3:.1f} ms (budget "
        f"{protocol.POLL_BUDGET_S * 1e3:.0f} ms + one chunk's decode); RSS {rss[0] / 1024:.0f} -> "
        f"{rss[len(rss) // 2] / 1024:.0f} -> {rss[-1] / 1024:.0f} MiB"
    )
    return {"worst": worst, "other": other, "views": view_failures, "rss0": rss[0], "rss1": rss[-1]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    snap_line = protocol.encode(SNAPSHOT).rstrip(b"\n")
    hello_line = protocol.encode(HELLO).rstrip(b"\n")
    base = json.loads(snap_line)

    def valid(rng: random.Random, n: int) -> bytes:
        return (snap_line + b"\n") * n

    def malformed(rng: random.Random, n: int) -> bytes:
        out = []
        for _ in range(n):
            line = hello_line if rng.random() < 0.1 else snap_line
            out.append(mutate(rng, base, line) + b"\n")
        return b"".join(out)

    base_run = run(min(args.messages, 200_000), args.seed, valid, "baseline")
    fuzz = run(args.messages, args.seed, malformed, "malformed")
    print(
        f"worst poll: fuzz {fuzz['worst'] * 1e3:.1f} ms vs baseline {base_run['worst'] * 1e3:.1f} ms "
        f"({fuzz['worst'] / base_run['worst']:.2f}x); non-protocol exceptions {fuzz['other']:.0f}; "
        f"views broken {fuzz['views']:.0f}; "
        f"RSS growth during the fuzz {(fuzz['rss1'] - fuzz['rss0']) / 1024:.1f} MiB"
    )
    return 1 if fuzz["other"] or fuzz["views"] else 0


if __name__ == "__main__":
    sys.exit(main())
