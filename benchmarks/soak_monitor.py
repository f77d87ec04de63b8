"""Soak of the monitor's reading side (issue 12): publishers churn for a while (default 10 minutes) — each a
real process serving the hook's Publisher for 1-5 s, then exiting cleanly, killed with SIGKILL (a stale
socket left behind) or dying "of OOM" (an OOM record written) — while one AnatomySource polls every 0.25 s,
as a monitor at a fast refresh does. Every 10 s: the monitor's RSS and open file descriptors. Printed: the
series and their least-squares slopes per minute (goal: flat), next to the first minute's level.

  .venv/bin/python benchmarks/soak_monitor.py [--minutes 10] [--spawn-every 0.5]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tui.sources.anatomy_source import AnatomySource  # noqa: E402

CHILD = r"""
import os, signal, sys, time
sys.path.insert(0, sys.argv[1])
from anatomy import protocol
from anatomy.protocol import Hello, Snapshot
from anatomy.protocol.publisher import Publisher
directory, life, mode = sys.argv[2], float(sys.argv[3]), sys.argv[4]
me = os.getpid()
hello = Hello(pid=me, host="soak", device="cpu", precision="fp32", optimizer="adamw", model_class="Soak",
              parameter_count=1000, torch_version="2.13.0", started_at=time.time())
pub = Publisher(hello, interval_s=0.05, directory=__import__("pathlib").Path(directory))
pub.start()
end = time.monotonic() + life
seq = 0
while time.monotonic() < end:
    seq += 1
    snap = Snapshot(pid=me, seq=seq, time=time.time(), step=seq, memory={"weights": 4000, "activations": seq},
                    expected_bytes_per_param={}, parameter_count=1000)
    pub.publish(snap)
    time.sleep(0.05)
if mode == "kill":
    os.kill(me, signal.SIGKILL)
if mode == "oom":
    pub.write_oom(snap)
pub.close()
"""


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def slope(xs: list[float], ys: list[float]) -> float:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--spawn-every", type=float, default=0.5)
    args = p.parse_args()
    rng = random.Random(1)
    base = Path(tempfile.mkdtemp(prefix="soak-", dir="/tmp"))
    directory = base / "run"
    directory.mkdir(mode=0o700)
    children: list[subprocess.Popen[bytes]] = []
    samples: list[tuple[float, int, int, int]] = []
    spawned = {"exit": 0, "kill": 0, "oom": 0}
    polls = 0
    worst = 0.0
    start = time.monotonic()
    next_spawn = next_sample = start
    try:
        with AnatomySource(directory) as source:
            while (now := time.monotonic()) - start < args.minutes * 60:
                if now >= next_spawn:
                    mode = rng.choice(["exit", "exit", "kill", "oom"])
                    spawned[mode] += 1
                    life = f"{rng.uniform(1, 5):.2f}"
                    children.append(
                        subprocess.Popen([sys.executable, "-c", CHILD, str(ROOT), str(directory), life, mode])
                    )
                    next_spawn += args.spawn_every
                children = [c for c in children if c.poll() is None]
                for oom in directory.glob("*.oom.json"):  # a user clears old OOM records
                    if time.time() - oom.stat().st_mtime > 10:
                        oom.unlink(missing_ok=True)
                t0 = time.perf_counter()
                shown = source.poll()
                worst = max(worst, time.perf_counter() - t0)
                polls += 1
                if now >= next_sample:
                    samples.append((now - start, rss_kib(), fds(), len(shown)))
                    next_sample += 10
                time.sleep(0.25)
    finally:
        for c in children:
            c.kill()
            c.wait()
        shutil.rmtree(base, ignore_errors=True)
    print(
        f"soak: {args.minutes:g} min, {sum(spawned.values())} publishers ({spawned}), {polls} polls, worst "
        f"poll {worst * 1e3:.1f} ms"
    )
    print("  t(s)  RSS(KiB)  fds  shown")
    for t, rss, fd, shown_n in samples:
        print(f"  {t:5.0f}  {rss:8d}  {fd:3d}  {shown_n:5d}")
    later = [s for s in samples if s[0] >= 60] or samples
    rss_slope = slope([t / 60 for t, *_ in later], [float(r) for _, r, _, _ in later])
    fd_slope = slope([t / 60 for t, *_ in later], [float(f) for _, _, f, _ in later])
    first = samples[min(6, len(samples) - 1)]
    print(
        f"after the first minute: RSS slope {rss_slope:+.1f} KiB/min (level {first[1]} KiB at 1 min, "
        f"{samples[-1][1]} KiB at the end); fd slope {fd_slope:+.3f}/min ({first[2]} -> {samples[-1][2]})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
