"""Shared pieces of the stack tests: a private runtime directory per test, tiny models built from configs
(nothing is downloaded), padded batches, a monitor-side reader of what the hook publishes, and the training
process's own counts (the independent truth each test compares the published figures with)."""

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
    """Every test gets its own ANATOMY_TOP_DIR; ANATOMY_TOP is unset unless a test sets it."""
    directory = tmp_path / "rt"
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(directory))
    monkeypatch.delenv("ANATOMY_TOP", raising=False)
    yield directory


def tiny_llama_config(layers: int = 2, vocab: int = 256, hidden: int = 64) -> object:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        use_cache=False,
        pad_token_id=0,
    )


def tiny_llama(seed: int = 0, layers: int = 2, hidden: int = 64) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(layers=layers, hidden=hidden))


def padded_batch(batch: int = 4, seq: int = 64, vocab: int = 256, seed: int = 1) -> dict[str, torch.Tensor]:
    """Token ids with left padding of a different length in every row: the model builds a (B, 1, S, S)
    attention mask from it."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    for row in range(batch):
        mask[row, : 3 + 5 * row] = 0
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A tiny in-memory causal-LM data set: random token ids, labels = ids."""

    def __init__(self, n: int = 32, seq: int = 32, vocab: int = 256, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def trainer_args(tmp: Path, steps: int, **extra: object) -> object:
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(tmp / "out"),
        per_device_train_batch_size=4,
        max_steps=steps,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
        **extra,
    )


def logged_losses(trainer: object) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]  # type: ignore[attr-defined]


def optimizer_state_bytes(optimizer: object) -> int:
    """The test's own count: numel * element_size of every tensor in the optimizer's state, each storage
    once."""
    seen: set[int] = set()
    total = 0
    for state in optimizer.state.values():  # type: ignore[attr-defined]
        for t in state.values():
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.numel() * t.element_size()
    return total


def forward_keeps(run: object) -> int:
    """Bytes allocated while ``run()`` (a forward returning its loss) runs and still allocated after it:
    what the forward keeps for backward, its loss included. Independent of saved-tensor hooks: torch's
    profiler records every allocation and free of the CPU allocator (``profile_memory``), and the sum of
    each op's own net memory is what the window allocated and did not free."""
    from torch.profiler import ProfilerActivity, profile

    assert callable(run)
    # The profiler sees every thread's allocations: a thread an earlier test left running (a publisher, a
    # logger's writer) can add to one window, never take from it, so the smallest of three windows is the
    # forward's own.
    nets = []
    for _ in range(3):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            loss = run()
        nets.append(sum(e.self_cpu_memory_usage for e in prof.events()))
        del loss
    return int(min(nets))
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
        tiny_llama=tiny_llama,
        tiny_llama_config=tiny_llama_config,
        padded_batch=padded_batch,
        forward_keeps=forward_keeps,
        Tokens=Tokens,
        trainer_args=trainer_args,
        logged_losses=logged_losses,
        optimizer_state_bytes=optimizer_state_bytes,
        Collector=Collector,
        Truth=Truth,
        gradient_bytes=gradient_bytes,
        state_bytes=state_bytes,
        mlp=mlp,
        batches=batches,
        phases_sum=phases_sum,
    )
