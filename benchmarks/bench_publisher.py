"""What the hook's publisher costs the training process.

1. publish() per call, against a bare attribute assignment (the floor) in the same run;
2. encoding one snapshot on the server thread, with and without the decode-back validation;
3. the server thread's CPU time per minute with N live readers at the default 0.5 s interval and at
   0.05 s (psutil per-thread times), next to its cost with no reader;
4. a CPU "training loop" (a 256x256 matmul per step, publish() every step) with N readers connected,
   against the same loop with no publisher: the ratio is what training pays.

  .venv/bin/python benchmarks/bench_publisher.py [--readers 8] [--window 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

from anatomy import protocol
from anatomy.protocol import CudaMemory, Hello, OpGroupStat, Snapshot, Suggestion, Timing
from anatomy.protocol.publisher import Publisher
from anatomy.vocabulary import Component, OpGroup


def hello() -> Hello:
    return Hello(
        pid=os.getpid(),
        host="bench",
        device="cuda:0",
        precision="bf16_mixed",
        optimizer="adamw",
        model_class="LlamaForCausalLM",
        parameter_count=7_000_000_000,
        torch_version=torch.__version__,
        started_at=time.time(),
    )


def snapshot(seq: int) -> Snapshot:
    """A realistic, fully populated snapshot (every component, op groups, five suggestions)."""
    return Snapshot(
        pid=os.getpid(),
        seq=seq,
        time=time.time(),
        step=seq,
        memory={c.value: 1_000_000 * (i + 1) for i, c in enumerate(Component)},
        expected_bytes_per_param={c.value: 4.0 for c in Component},
        parameter_count=7_000_000_000,
        peak_bytes=70_000_000_000,
        peak_phase="backward",
        memory_source="cuda_allocator",
        cuda=CudaMemory(allocated=1, reserved=2, peak_allocated=3, alloc_retries=0, ooms=0),
        timing=Timing(step_s=0.5, forward_s=0.15, backward_s=0.3, optimizer_s=0.05, samples_per_s=64.0),
        op_groups={g.value: OpGroupStat(flops=1e12, time_s=0.1) for g in OpGroup},
        op_groups_step=50,
        achieved_tflops=400.0,
        mfu=0.4,
        suggestions=[
            Suggestion(f"rule{i}", "A title", "A detail line " * 10, "guide", 10**9, 1.2) for i in range(5)
        ],
    )


class Plain:
    """The floor: a method that only assigns, called the same way as Publisher.publish."""

    latest: Snapshot | None = None

    def publish(self, snapshot: Snapshot) -> None:
        self.latest = snapshot


def per_call(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def thread_cpu(native_id: int) -> float:
    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    return 0.0


_DRAIN = """
import select, socket, sys
socks = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    socks.append(s)
print("connected", flush=True)
while socks:
    ready, _, _ = select.select(socks, [], [], 1.0)
    for s in ready:
        if not s.recv(1 << 16):
            socks.remove(s)
"""


def connect_readers(path: Path, n: int) -> subprocess.Popen[bytes]:
    """N readers in another process (as monitors are), draining everything the publisher sends."""
    proc = subprocess.Popen([sys.executable, "-c", _DRAIN, str(path), str(n)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"connected"
    return proc


def stop_readers(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--readers", type=int, default=8)
    parser.add_argument("--window", type=float, default=5.0)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="atb-", dir="/tmp"))
    try:
        run(args.readers, args.window, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(n_readers: int, window: float, tmp: Path) -> None:
    snaps = [snapshot(i) for i in range(1000)]
    size = len(protocol.encode(snaps[0]))
    print(f"snapshot: {size} bytes encoded; {n_readers} readers")

    # 1. publish() against a bare assignment
    plain = Plain()
    pub = Publisher(hello(), interval_s=0.5, directory=tmp / "a")
    assert pub.start() is not None
    readers = connect_readers(pub.path, n_readers)  # type: ignore[arg-type]
    n = 200_000
    s0 = snaps[0]
    floor = statistics.median(per_call(lambda: plain.publish(s0), n) for _ in range(5))
    cost = statistics.median(per_call(lambda: pub.publish(s0), n) for _ in range(5))
    print(
        f"1. publish(): {cost * 1e9:.0f} ns/call; bare assignment {floor * 1e9:.0f} ns; "
        f"ratio {cost / floor:.2f}x"
    )

    # 2. encode with and without validation
    enc_v = statistics.median(per_call(lambda: protocol.encode(s0), 2000) for _ in range(5))
    enc = statistics.median(per_call(lambda: protocol.encode(s0, validate=False), 2000) for _ in range(5))
    print(
        f"2. encode(): {enc * 1e6:.0f} us, with decode-back validation {enc_v * 1e6:.0f} us "
        f"(ratio {enc_v / enc:.2f}x); at a 0.5 s interval that is {enc_v / 0.5 * 100:.3f}% of one core"
    )

    # 3. server thread CPU per minute
    assert pub._thread is not None and pub._thread.native_id is not None
    native = pub._thread.native_id
    for interval in (0.5, 0.05):
        pub.interval_s = interval
        c0, t0 = thread_cpu(native), time.monotonic()
        i = 0
        while time.monotonic() - t0 < window:
            pub.publish(snaps[i % len(snaps)])
            i += 1
            time.sleep(0.01)  # a 100 steps/s training loop
        cpu = thread_cpu(native) - c0
        elapsed = time.monotonic() - t0
        print(
            f"3. server thread, {n_readers} readers, interval {interval} s: "
            f"{cpu / elapsed * 60:.3f} CPU s/min (psutil ticks of 0.01 s); "
            f"{pub.messages_sent} messages so far"
        )
    stop_readers(readers)
    pub.close()

    # 4. a training loop with and without the publisher
    torch.manual_seed(0)
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def loop(p: Publisher | None, steps: int = 400) -> tuple[float, float]:
        w, c = time.perf_counter(), time.thread_time()
        for i in range(steps):
            torch.mm(a, b)
            if p is not None:
                p.publish(snaps[i % len(snaps)])
        return time.perf_counter() - w, time.thread_time() - c

    torch.set_num_threads(1)
    pub = Publisher(hello(), interval_s=0.05, directory=tmp / "b")
    assert pub.start() is not None
    readers = connect_readers(pub.path, n_readers)  # type: ignore[arg-type]
    loop(None, 50)
    with_pub: list[tuple[float, float]] = []
    without: list[tuple[float, float]] = []
    for _ in range(15):
        without.append(loop(None))
        with_pub.append(loop(pub))
    stop_readers(readers)
    pub.close()
    for k, label in ((0, "wall"), (1, "training-thread CPU")):
        w = statistics.median(x[k] for x in with_pub)
        wo = statistics.median(x[k] for x in without)
        print(
            f"4. training loop (400 x mm 256^2, 1 thread), {label}: {wo * 1000:.1f} ms without, "
            f"{w * 1000:.1f} ms with publisher + {n_readers} readers at 0.05 s: ratio {w / wo:.3f}x"
        )


if __name__ == "__main__":
    main()
