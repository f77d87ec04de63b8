"""NVML read just before each scrape when scrapes are steady: one read per scrape, never more, each
at most a second old; irregular scrapes read at the scrape; a scrape that comes too late does not use
an old reading."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tui import simnvml
from tui.exporter.collector import NodeCollector
from tui.exporter.read_ahead import MAX_AGE_S, ReadAhead

INTERVAL_S = 0.3


class Reads:
    def __init__(self) -> None:
        self.count = 0
        self.threads: set[str] = set()

    def __call__(self) -> int:
        self.count += 1
        self.threads.add(threading.current_thread().name)
        return self.count


def _scrape(ahead: ReadAhead[int], reads: Reads) -> tuple[int, float]:
    began = time.monotonic()
    taken = ahead.take()
    result = taken if taken is not None else (reads(), 0.0)
    ahead.scraped(began)
    return result


def test_steady_scrapes_get_a_reading_made_just_before_them() -> None:
    reads = Reads()
    ahead: ReadAhead[int] = ReadAhead(reads)
    results = []
    for i in range(10):
        if i:
            time.sleep(INTERVAL_S)
        results.append(_scrape(ahead, reads))
    ahead.close()  # the read planned for an 11th scrape is called off
    # The first scrapes read for themselves; once 3 intervals agree, each scrape takes the read made for
    # it, at most a lead (0.1 s) and the jitter old.
    assert [age for _, age in results[:4]] == [0.0] * 4
    later = [age for _, age in results[5:]]
    assert all(0 < age < 0.3 for age in later), results
    # One read per scrape, never more: each reading is a new one, none is wasted or taken twice.
    assert [n for n, _ in results] == list(range(1, 11)) and reads.count == 10
    assert ahead.used == sum(1 for _, age in results if age > 0) and ahead.stale == 0
    assert any(name != threading.current_thread().name for name in reads.threads)


def test_irregular_scrapes_read_at_the_scrape() -> None:
    reads = Reads()
    ahead: ReadAhead[int] = ReadAhead(reads)
    for pause in (0.05, 0.4, 0.1, 0.5, 0.05, 0.45, 0.1):
        _, age = _scrape(ahead, reads)
        assert age == 0.0
        time.sleep(pause)
    assert reads.count == 7 and ahead.used == 0


def test_a_late_scrape_does_not_take_an_old_reading() -> None:
    now = [100.0]
    reads = Reads()
    ahead: ReadAhead[int] = ReadAhead(reads, clock=lambda: now[0], lead_s=0.0)
    for _ in range(4):  # steady on the fake clock: a read is planned for 1 s later (real time: now)
        ahead.scraped(now[0])
        now[0] += 1.0
    deadline = time.monotonic() + 5
    while reads.count == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reads.count == 1  # the planned read happened (its timer's delay was ~0 in real time)
    now[0] += MAX_AGE_S + 5  # ... and the scrape comes much later
    assert ahead.take() is None and ahead.stale == 1
    ahead.close()


def test_the_exporter_reads_nvml_ahead_of_steady_scrapes(
    sim: Callable[..., Any], scrape: Callable[..., Any], one: Callable[..., float]
) -> None:
    lib = sim(simnvml.Scenario.demo_box(2))
    collector = NodeCollector()
    ages, calls = [], []
    scrape(collector)
    before = lib.total_calls
    for _ in range(8):
        time.sleep(INTERVAL_S)
        series = scrape(collector)
        ages.append(one(series, "anatomy_exporter_nvml_age_seconds"))
        calls.append(one(series, "anatomy_exporter_nvml_calls"))
    collector.close()
    assert ages[0] == 0.0 and all(0 < a < 0.3 for a in ages[-3:]), ages
    # 5 per GPU (memory, utilization, power, two process lists; no process: no per-process
    # utilization), every scrape, read ahead or not
    assert calls == [10.0] * 8
    assert lib.total_calls - before <= sum(calls) + 10  # + at most one read for a scrape never made
