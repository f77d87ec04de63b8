"""Fixtures for the exporter's tests: real publishers (anatomy.protocol.publisher) on the wire, the
simulated NVML under unmodified pynvml, and scrapes parsed back with prometheus_client's own parser."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client", reason="the 'exporter' extra (prometheus-client) is not installed")

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from anatomy import protocol
from anatomy.protocol import CudaMemory, Hello, OpGroupStat, Snapshot, Timing
from anatomy.protocol.publisher import Publisher
from anatomy.vocabulary import Component
from tui import simnvml
from tui.exporter.collector import NodeCollector
from tui.exporter.server import build_registry

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def make_hello(pid: int, **kw: Any) -> Hello:
    fields: dict[str, Any] = dict(
        pid=pid,
        host="node-a",
        device="cuda:0",
        precision="bf16_mixed",
        optimizer="adamw",
        model_class="LlamaForCausalLM",
        parameter_count=1_000_000,
        torch_version="2.13.0",
        started_at=1_795_000_000.0,
        optimizer_class="AdamW",
    )
    fields.update(kw)
    return Hello(**fields)


def make_snapshot(pid: int, seq: int = 1, weights: int = 6_000_000, **kw: Any) -> Snapshot:
    memory: dict[str, int | None] = {
        Component.CUDA_CONTEXT.value: 500_000_000,
        Component.ALLOCATOR_CACHE.value: 20_000_000,
        Component.WEIGHTS.value: weights,
        Component.OPTIMIZER_STATES.value: 8_000_000,
        Component.GRADIENTS.value: 4_000_000,
        Component.ACTIVATIONS.value: 10_000_000 + seq,
        Component.TEMPORARIES.value: 1_000_000,
        Component.UNATTRIBUTED.value: None,  # unmeasured: must not become a 0
    }
    fields: dict[str, Any] = dict(
        pid=pid,
        seq=seq,
        time=time.time(),
        step=seq,
        memory=memory,
        expected_bytes_per_param={"weights": 6.0},
        parameter_count=1_000_000,
        peak_bytes=29_000_000,
        peak_phase="backward",
        memory_source="cuda_allocator",
        cuda=CudaMemory(
            allocated=25_000_000, reserved=45_000_000, peak_allocated=29_000_000, alloc_retries=2, ooms=0
        ),
        timing=Timing(
            step_s=0.5,
            forward_s=0.1,
            backward_s=0.25,
            optimizer_s=0.05,
            samples_per_s=64.0,
            tokens_per_s=65536.0,
        ),
        op_groups={
            "tensor_contractions": OpGroupStat(flops=1e12, time_s=0.3),
            "element_wise": OpGroupStat(flops=1e9, time_s=0.05),
        },
        op_groups_step=seq,
        achieved_tflops=123.0,
        mfu=0.42,
        at_peak={
            "weights": weights,
            "optimizer_states": 8_000_000,
            "gradients": 4_000_000,
            "activations": 11_000_000,
        },
    )
    fields.update(kw)
    return Snapshot(**fields)


@pytest.fixture
def runtime(tmp_path: Path) -> Path:
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture
def publishers() -> Iterator[Callable[..., Publisher]]:
    """``start(directory, hello, snapshot)`` → a started real Publisher; all closed afterwards."""
    started: list[Publisher] = []

    def start(directory: Path, hello: Hello, snapshot: Snapshot | None = None) -> Publisher:
        pub = Publisher(hello, interval_s=0.0, directory=directory)
        assert pub.start() is not None
        if snapshot is not None:
            pub.publish(snapshot)
        started.append(pub)
        return pub

    yield start
    for pub in started:
        pub.close()


FAKE_RANK = Path(__file__).with_name("fake_rank.py")


class FakeRank:
    """A rank in its own process (tests/exporter/fake_rank.py): socket server, published PID and NVML
    PID are one process, as with a real hook."""

    def __init__(
        self,
        directory: Path,
        hello: Hello,
        snapshot: Snapshot | None,
        every: float = 0.0,
        wrap: tuple[str, ...] = (),
    ) -> None:
        """``wrap``: a command that runs the rank (e.g. ``unshare --pid --fork``: a rank in a container)."""
        args = [*wrap, sys.executable, str(FAKE_RANK), str(directory)]
        args += ["--every", str(every)] if every else []
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.pid = self.proc.pid
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(protocol.encode(hello))
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().decode()
        assert line.startswith("ready "), f"fake rank did not start: {line!r}"
        self.path = Path(line.split(" ", 1)[1].strip())
        if snapshot is not None:
            self.publish(snapshot)

    def publish(self, snapshot: Snapshot) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(protocol.encode(snapshot))
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def ranks() -> Iterator[Callable[..., FakeRank]]:
    """``start(directory, hello, snapshot)`` → a FakeRank (its own process); all ended afterwards."""
    started: list[FakeRank] = []

    def start(
        directory: Path,
        hello: Hello,
        snapshot: Snapshot | None = None,
        every: float = 0.0,
        wrap: tuple[str, ...] = (),
    ) -> FakeRank:
        rank = FakeRank(directory, hello, snapshot, every, wrap)
        started.append(rank)
        return rank

    yield start
    for rank in started:
        rank.close()


@pytest.fixture
def sim() -> Iterator[Callable[..., Any]]:
    """Install a simulated NVML (the real pynvml path) for one test; uninstalled afterwards."""
    installed = False

    def install(scenario: Any) -> Any:
        nonlocal installed
        installed = True
        return simnvml.install(scenario)

    yield install
    if installed:
        simnvml.uninstall()


@pytest.fixture
def no_nvml() -> Iterator[None]:
    """A machine without the driver, whatever this one has."""
    simnvml.install(simnvml.Scenario.demo_box(1), library_missing=True)
    yield
    simnvml.uninstall()


def parse(text: bytes | str) -> Series:
    out: Series = {}
    body = text.decode() if isinstance(text, bytes) else text
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"series written twice: {key}"
            out[key] = sample.value
    return out


def pick(series: Series, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return {lab: v for (n, lab), v in series.items() if n == name and want <= set(lab)}


def one(series: Series, name: str, **labels: str) -> float:
    found = pick(series, name, **labels)
    assert len(found) == 1, f"{name}{labels}: {len(found)} series: {sorted(map(sorted, found))}"
    return next(iter(found.values()))


@pytest.fixture
def scrape() -> Iterator[Callable[..., Series]]:
    """``scrape(collector)`` → every series of one scrape of the registry the server serves."""
    collectors: list[NodeCollector] = []

    def run(collector: NodeCollector, wait_s: float = 1.0) -> Series:
        if collector not in collectors:
            collectors.append(collector)
            collector.scrape(wait_s=wait_s)  # the first scrape connects; wait for hellos and snapshots
        return parse(generate_latest(build_registry(collector)))

    yield run
    for c in collectors:
        c.close()


# --import-mode=importlib: test modules cannot import this one; they take its helpers as fixtures.
@pytest.fixture(name="make_hello")
def _make_hello() -> Callable[..., Hello]:
    return make_hello


@pytest.fixture(name="make_snapshot")
def _make_snapshot() -> Callable[..., Snapshot]:
    return make_snapshot


@pytest.fixture(name="one")
def _one() -> Callable[..., float]:
    return one


@pytest.fixture(name="pick")
def _pick() -> Callable[..., dict[frozenset[tuple[str, str]], float]]:
    return pick


@pytest.fixture(name="parse")
def _parse() -> Callable[[bytes | str], Series]:
    return parse
