"""A stand-in for a training rank: its own process serving the hook's real Publisher, so that the socket's
server, the published PID and NVML's PID are one process, as with a real hook.

    python tests/exporter/fake_rank.py DIR [--every SECONDS]

Reads wire-protocol lines on stdin: a hello, then snapshots (each published as it arrives; its own PID
replaces whatever PID the lines carry). Prints ``ready <socket path>`` once serving. With ``--every``,
republishes the latest snapshot with the next ``seq`` and a fresh time at that period, as a hook does
each step. Ends, removing its socket, when stdin closes. Stdlib and anatomy only.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from anatomy import protocol  # noqa: E402
from anatomy.protocol import Hello, Snapshot  # noqa: E402
from anatomy.protocol.publisher import Publisher  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("directory", type=Path)
    p.add_argument("--every", type=float, default=0.0)
    args = p.parse_args()
    me = os.getpid()
    hello = protocol.decode(sys.stdin.buffer.readline())
    assert isinstance(hello, Hello)
    pub = Publisher(dataclasses.replace(hello, pid=me), interval_s=0.0, directory=args.directory)
    path = pub.start()
    if path is None:
        print("failed", flush=True)
        return 1
    latest: list[Snapshot] = []
    lock = threading.Lock()

    def tick() -> None:
        while True:
            time.sleep(args.every)
            with lock:
                if latest:
                    latest[0] = dataclasses.replace(latest[0], seq=latest[0].seq + 1, time=time.time())
                    pub.publish(latest[0])

    if args.every > 0:
        threading.Thread(target=tick, daemon=True).start()
    print(f"ready {path}", flush=True)
    for line in sys.stdin.buffer:
        snap = protocol.decode(line)
        assert isinstance(snap, Snapshot)
        with lock:
            latest[:] = [dataclasses.replace(snap, pid=me)]
            pub.publish(latest[0])
    pub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
