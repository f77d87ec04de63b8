"""Shared pieces of the stack tests: a private runtime directory per test, a monitor-side reader of what
the hook publishes, and the training process's own counts (the independent truth each test compares
the published figures with)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from anatomy import protocol


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    directory = tmp_path / "rt"
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(directory))
    monkeypatch.delenv("ANATOMY_TOP", raising=False)
    yield directory


@pytest.fixture
def published(monkeypatch: pytest.MonkeyPatch) -> list[protocol.Snapshot]:
    """Every snapshot the hook hands its publisher, in order (the monitor's reader keeps only the
    latest of those that arrive between two polls; this sees each one)."""
    from anatomy.hook.publishing import Channel

    seen: list[protocol.Snapshot] = []
    original = Channel.publish

    def publish(self: Channel, snap: protocol.Snapshot, hello: protocol.Hello) -> None:
        seen.append(snap)
        original(self, snap, hello)

    monkeypatch.setattr(Channel, "publish", publish)
    return seen


class Collector(threading.Thread):
    """A monitor-side reader: waits for the hook's socket, then keeps every snapshot it receives."""

    def __init__(self, directory: Path) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.hello: protocol.Hello | None = None
        self.snapshots: list[protocol.Snapshot] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 60
        reader = None
        while reader is None and not self.stop_event.is_set() and time.monotonic() < deadline:
            found = protocol.discover(self.directory)
            if found:
                reader = protocol.Reader(found[0])
            else:
                time.sleep(0.005)
        if reader is None:
            return
        with reader:
            while not reader.closed and not self.stop_event.is_set():
                if reader.poll():
                    self.hello = reader.hello
                    snap = reader.snapshot
                    if snap is not None and (not self.snapshots or snap.seq != self.snapshots[-1].seq):
                        self.snapshots.append(snap)
                time.sleep(0.002)

    def finish(self) -> list[protocol.Snapshot]:
        self.stop_event.set()
        self.join(timeout=10)
        return self.snapshots


class Truth:
    """What the training process itself counts: optimizer updates (its own step post-hooks, which a
    skipped step does not fire), and per update the bytes of gradients (before the update) and
    optimizer states (after it), each storage once."""

    def __init__(self, model: torch.nn.Module, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        self.model = model
        self.optimizers = list(optimizers)
        self.updates = 0
        self.grads: list[int] = []  # gradient bytes at each update's start
        self.states: list[int] = []  # optimizer state bytes after each update
        self._handles = []
        for opt in self.optimizers:
            self._handles.append(opt.register_step_pre_hook(self._pre))
            self._handles.append(opt.register_step_post_hook(self._post))
        self._pending_grads = 0

    def _pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        self._pending_grads = gradient_bytes(self.model)

    def _post(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.updates += 1
        self.grads.append(max(self._pending_grads, gradient_bytes(self.model)))
        self.states.append(sum(state_bytes(o) for o in self.optimizers))

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def gradient_bytes(model: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        g = p.grad
        if g is not None and _storage(g) not in seen:
            seen.add(_storage(g))
            total += g.numel() * g.element_size()
    return total


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Every tensor in ``optimizer.state``, also inside lists (LBFGS keeps its history in lists)."""
    seen: set[int] = set()
    total = 0
    for per_param in optimizer.state.values():
        stack: list[Any] = list(per_param.values())
        while stack:
            value = stack.pop()
            if isinstance(value, (list, tuple)):
                stack.extend(value)
            elif isinstance(value, torch.Tensor) and _storage(value) not in seen:
                seen.add(_storage(value))
                total += value.numel() * value.element_size()
    return total


def mlp(seed: int = 0, width: int = 32, depth: int = 2) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers)


def batches(
    n: int, seed: int = 1, batch: int = 8, width: int = 32
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, width, generator=g), torch.randn(batch, 1, generator=g)) for _ in range(n)]


def phases_sum(snap: protocol.Snapshot) -> float:
    t = snap.timing
    return float((t.forward_s or 0.0) + (t.backward_s or 0.0) + (t.optimizer_s or 0.0))


@pytest.fixture
def st() -> SimpleNamespace:
    """The helpers above (importlib import mode cannot import conftest from a test module)."""
    return SimpleNamespace(
        Collector=Collector,
        Truth=Truth,
        gradient_bytes=gradient_bytes,
        state_bytes=state_bytes,
        mlp=mlp,
        batches=batches,
        phases_sum=phases_sum,
    )
