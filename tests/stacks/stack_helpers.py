"""What the stack tests (tests/stacks/) and benchmarks/stacks_before_after.py share: tiny models built from
configs (nothing is downloaded), padded batches, a monitor-side reader of what the hook publishes, and the
training process's own counts — the independent truth each published figure is compared with."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from anatomy import protocol

__all__ = [
    "Collector",
    "QuantizedNet",
    "Tokens",
    "Truth",
    "batches",
    "forward_keeps",
    "gradient_bytes",
    "logged_losses",
    "mlp",
    "module_bytes",
    "optimizer_state_bytes",
    "padded_batch",
    "phases_sum",
    "quant_state_tensors",
    "quantized_counts",
    "state_bytes",
    "tiny_llama",
    "tiny_llama_config",
    "trainer_args",
]


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


# What differs between two runs of the same training whatever the hook does: the times, and what follows from
# them (suggestions, rates), and the heap's peak (each run starts where the last left it).
PER_RUN = ("seq", "time", "timing", "suggestions", "achieved_tflops", "mfu")
PER_RUN += ("peak_bytes", "peak_phase", "at_peak")


def comparable(snapshots: Iterable[protocol.Snapshot]) -> list[dict[str, object]]:
    """The snapshots' fields but PER_RUN, each memory component as present or not: what a run with steps
    resting must publish as the same run with every step watched does."""
    return [
        {k: v for k, v in dataclasses.asdict(s).items() if k not in PER_RUN}
        | {"memory": {c: v is not None for c, v in s.memory.items()}}
        for s in snapshots
    ]


def assert_rested_as_watched(watched_run: tuple[Any, ...], resting_run: tuple[Any, ...]) -> None:
    """A fit of 16 batches of 8 and a last of 6, once with every step watched and once resting where it may
    (each run: its ``comparable`` snapshots, its losses, whether our hooks were on at each step's forward):
    from the 5th step on the steps rest, the last one (other samples) is watched, and every snapshot and loss
    is the watched run's."""
    (full, full_losses, always), (rested, rest_losses, watched) = watched_run[:3], resting_run[:3]
    assert all(always) and len(always) == 16
    assert not any(watched[4:15]) and watched[15], watched  # (the last batch: 6 samples, watched)
    assert rest_losses == full_losses
    assert [s["step"] for s in rested] == [s["step"] for s in full] == list(range(16))
    for a, b in zip(rested, full, strict=True):
        assert a == b, a["step"]
    assert rested[-1]["batch_size"] == 6 and rested[-2]["batch_size"] == 8


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
    # forward's own. A free can take from a window, though: the cycle collector, run by the forward's own
    # allocations, freed an earlier training's garbage inside one (256 KiB under the forward's keeping, in
    # test_the_mask_kept_by_every_checkpoint_counts_once), so the windows start from a collected heap and
    # collect nothing.
    nets = []
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(3):
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                loss = run()
            nets.append(sum(e.self_cpu_memory_usage for e in prof.events()))
            del loss
    finally:
        if enabled:
            gc.enable()
    return int(min(nets))


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


def module_bytes(*modules: torch.nn.Module, exclude: torch.nn.Module | None = None) -> int:
    """numel * element_size of each parameter and buffer of ``modules``, each storage once, those of
    ``exclude`` not at all."""
    skip = {t.untyped_storage().data_ptr() for t in exclude.state_dict().values()} if exclude else set()
    seen: set[int] = set(skip)
    total = 0
    for m in modules:
        for t in [*m.parameters(), *m.buffers()]:
            if t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total += t.numel() * t.element_size()
    return total


class QuantizedNet(torch.nn.Module):
    """bitsandbytes layers (``kind``: nf4 with double quantization, fp4, int8), frozen, each with a trainable
    low-rank adapter, and a trainable head (bitsandbytes is imported when one is built)."""

    def __init__(self, kind: str, hidden: int = 128, layers: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleList(_quantized_layer(kind, hidden) for _ in range(layers))
        self.down = torch.nn.ModuleList(torch.nn.Linear(hidden, 4, bias=False) for _ in range(layers))
        self.up = torch.nn.ModuleList(torch.nn.Linear(4, hidden, bias=False) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, 8)
        for p in self.layers.parameters():
            p.requires_grad_(False)
        self.norm.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, down, up in zip(self.layers, self.down, self.up, strict=True):
            x = torch.relu(layer(x) + up(down(x)))
        return self.head(self.norm(x))  # type: ignore[no-any-return]


def _quantized_layer(kind: str, hidden: int) -> torch.nn.Module:
    import bitsandbytes as bnb

    if kind == "int8":
        return bnb.nn.Linear8bitLt(hidden, hidden, has_fp16_weights=False).to("cpu")  # type: ignore[no-any-return]
    layer = bnb.nn.Linear4bit(
        hidden, hidden, compute_dtype=torch.float32, quant_type=kind, compress_statistics=kind == "nf4"
    )
    return layer.to("cpu")  # type: ignore[no-any-return]  # (quantizes the weight)


def quant_state_tensors(layer: torch.nn.Module, p: torch.Tensor) -> list[torch.Tensor]:
    """Our own reading of bitsandbytes' state: QuantState's absmax, code, offset and, with double
    quantization, state2's absmax and code; Int8Params' row scales SCB (its CB is the weight itself), which
    the layer's first forward moves to ``layer.state``."""
    out = []
    state = getattr(layer, "state", None)
    if getattr(state, "SCB", None) is not None and p is layer.weight:
        out.append(state.SCB)
        assert state.CB.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
    qs = getattr(p, "quant_state", None)
    if qs is not None:
        out += [qs.absmax, qs.code]
        if qs.offset is not None:
            out.append(qs.offset)
        if qs.state2 is not None:
            out += [qs.state2.absmax, qs.state2.code]
    if getattr(p, "SCB", None) is not None:
        out.append(p.SCB)
        assert p.CB.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
    return out


def quantized_counts(model: QuantizedNet) -> tuple[int, int, int]:
    """(logical parameter count, weight bytes with the quantization state, the state's bytes): a packed
    4-bit weight counts the elements of its ``quant_state.shape``; every storage once."""
    logical = 0
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        logical += int(torch.Size(qs.shape).numel()) if qs is not None else p.numel()
    seen: set[int] = set()
    weights = state = 0
    for t in [*model.parameters(), *model.buffers()]:
        if t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            weights += t.untyped_storage().nbytes()
    for layer in model.layers:
        for t in (t for p in layer.parameters() for t in quant_state_tensors(layer, p)):
            if t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                state += t.untyped_storage().nbytes()
    return logical, weights + state, state
