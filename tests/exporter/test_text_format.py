"""The exporter's own writers (text format, OpenMetrics) write exactly what prometheus_client's do: on a
busy node's scrape, on label values and help texts that need escaping, and on families it hands back to
prometheus_client (histograms, counters with ``_created``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.openmetrics import exposition as openmetrics

from tui import simnvml
from tui.exporter import text_format
from tui.exporter.collector import NodeCollector
from tui.exporter.server import build_registry
from tui.simnvml.processes import sleepers

ESCAPINGS = (openmetrics.UNDERSCORES, openmetrics.ALLOWUTF8, openmetrics.VALUES, openmetrics.DOTS)


class Frozen:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def test_a_node_scrape_is_written_byte_for_byte(
    sim: Callable[..., Any],
    runtime: Any,
    ranks: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
) -> None:
    rank = ranks(runtime, make_hello(0, rank=0, run_id='job "7"\\x'), make_snapshot(0))
    with sleepers(6) as pids:
        sim(simnvml.Scenario.demo_box(2, pids=[rank.pid, *pids]))
        collector = NodeCollector(dirs=[runtime])
        try:
            collector.scrape(wait_s=2.0)
            metrics = list(build_registry(collector).collect())  # one scrape, written twice
        finally:
            collector.close()
    frozen = Frozen(metrics)
    ours = text_format.generate_latest(frozen)
    assert ours == generate_latest(frozen)  # type: ignore[arg-type]
    for escaping in ESCAPINGS:  # OpenMetrics, as Prometheus asks for it
        assert text_format.generate_latest_openmetrics(
            frozen, escaping=escaping
        ) == openmetrics.generate_latest(frozen, escaping=escaping), escaping
    assert b"anatomy_process_gpu_memory_used_bytes{" in ours and b"process_cpu_seconds_total " in ours
    assert b'run_id="job \\"7\\"\\\\x"' in ours  # a quote and a backslash, escaped


def test_escapes_and_families_it_hands_back() -> None:
    gauge = GaugeMetricFamily("g_bytes", 'help with \\ and\nnewline and "quotes"', labels=["b", "a"])
    gauge.add_metric(['x"y', "line\nbreak\\"], 1.5)
    gauge.add_metric(["plain", "ünïcødé"], float("inf"))
    gauge.add_metric(["nan", ""], float("nan"))
    counter = CounterMetricFamily("c_events", "a counter", labels=["k"])
    counter.add_metric(["v"], 12345678901.0)
    created = CounterMetricFamily("c_created_events", "with _created", labels=[], created=1700000000.0)
    created.add_metric([], 3.0, created=1700000000.0)
    histogram = HistogramMetricFamily("h_seconds", "a histogram", labels=["x"])
    histogram.add_metric(["1"], [("0.1", 1.0), ("+Inf", 3.0)], 0.7)
    untyped = UnknownMetricFamily("u_thing", "untyped", value=2.0)
    empty = GaugeMetricFamily("empty_gauge", "no samples")
    unit = GaugeMetricFamily("u_seconds", "with a unit", unit="seconds")
    unit.add_metric([], 1.0)
    for metrics in ([gauge, counter, created, histogram, untyped, empty, unit], [histogram, gauge]):
        frozen = Frozen(metrics)
        assert text_format.generate_latest(frozen) == generate_latest(frozen)  # type: ignore[arg-type]
        for escaping in ESCAPINGS:
            for version in ("1.0.0", "2.0.0"):
                ours = text_format.generate_latest_openmetrics(frozen, escaping=escaping, version=version)
                theirs = openmetrics.generate_latest(frozen, escaping=escaping, version=version)
                assert ours == theirs, (escaping, version)
