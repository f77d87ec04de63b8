"""Independent measurement of a real CPU training step, for checking `anatomy.plan` against.

Nothing here uses the planner's machinery: weights, gradients and optimizer states are sums of
``numel * element_size`` over real tensors; activations are what ``saved_tensors_hooks`` sees during
the real forward (storage-deduplicated by data pointer, parameters excluded, autocast's weight copies
recognised by value: equal to a parameter cast to their dtype); the peak is glibc's in-use heap
(``mallinfo2``) read after every aten op of the step, on top of the tensor bytes alive before it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from anatomy.plan import PlanSettings, build_model, enable_checkpointing, make_inputs, prepare_config
from anatomy.vocabulary import Phase, Precision


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_mallinfo2 = getattr(_libc, "mallinfo2", None)
if _mallinfo2 is not None:
    _mallinfo2.restype = _Mallinfo2


def heap_in_use() -> int:
    if _mallinfo2 is None:
        pytest.fail("glibc mallinfo2 is needed for the peak oracle")
    info = _mallinfo2()
    return int(info.uordblks) + int(info.hblkhd)


class HeapPeak(TorchDispatchMode):
    """The highest in-use heap seen after any op, and the phase it was seen in."""

    def __init__(self) -> None:
        super().__init__()
        self.phase = Phase.FORWARD
        self.peak = 0
        self.peak_phase = Phase.FORWARD
        self.paused = False

    def sample(self) -> None:
        if self.paused:
            return
        now = heap_in_use()
        if now > self.peak:
            self.peak, self.peak_phase = now, self.phase

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.sample()
        return out


def _storages_bytes(tensors: Any) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _tensors_in(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict) or hasattr(value, "values"):
        return [t for v in value.values() for t in _tensors_in(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


@dataclass
class Measured:
    weights: int  # parameters + buffers + autocast weight copies
    weight_copies: int
    gradients: int
    optimizer_states: int
    activations: int
    peak: int
    peak_phase: Phase


def make_optimizer(name: str, model: torch.nn.Module) -> Any:
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-4)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(model.parameters(), lr=1e-3, relative_step=False, scale_parameter=False)
    if name == "adafactor-torch":
        return torch.optim.Adafactor(model.parameters(), lr=1e-3)
    raise ValueError(name)


def _autocast(precision: Precision) -> contextlib.AbstractContextManager:
    if precision is Precision.BF16_MIXED:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def measure_real_step(config: Any, task: str, settings: PlanSettings, steps: int = 3) -> Measured:
    """Train ``steps`` real steps on CPU as a plain loop does (``out = model(...)`` held until the
    next forward returns); measure the last one."""
    torch.manual_seed(0)
    cfg = prepare_config(config, task)
    model = build_model(cfg, task)
    model.train()
    if settings.gradient_checkpointing:
        enable_checkpointing(model)
    optimizer = make_optimizer(settings.optimizer, model)
    params = {p.untyped_storage().data_ptr(): p for p in model.parameters()}
    weights = _storages_bytes(list(model.parameters()) + list(model.buffers()))
    out: Any = None
    result: Measured | None = None
    for step in range(steps):
        last = step == steps - 1
        optimizer.zero_grad(set_to_none=True)
        acts: dict[int, int] = {}
        copies: dict[int, int] = {}
        sampler = HeapPeak() if last else None

        def pack(
            t: torch.Tensor,
            acts: dict[int, int] = acts,
            copies: dict[int, int] = copies,
            sampler: HeapPeak | None = sampler,
        ) -> torch.Tensor:
            # Only sizes are kept: holding the tensors would keep them alive through backward.
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in params or key in acts or key in copies:
                return t
            if sampler is not None:
                sampler.paused = True
            with torch.no_grad():
                # A copy may be saved as a view (a transposed weight): compare whole storages.
                flat = torch.empty(0, dtype=t.dtype).set_(st)
                is_copy = any(
                    p.numel() == flat.numel()
                    and p.dtype != t.dtype
                    and torch.equal(p.detach().to(t.dtype).reshape(-1), flat)
                    for p in params.values()
                )
            if sampler is not None:
                sampler.paused = False
            (copies if is_copy else acts)[key] = st.nbytes()
            return t

        live_before = 0
        heap_before = 0
        for micro in range(settings.grad_accum):
            inputs = make_inputs(cfg, task, settings.batch_size, settings.seq_len)
            if sampler is not None and micro == 0:
                states = _storages_bytes(t for s in optimizer.state.values() for t in _tensors_in(s))
                held = _storages_bytes(_tensors_in(out)) if out is not None else 0
                live_before = weights + states + held + _storages_bytes(inputs.values())
                heap_before = heap_in_use()
                sampler.__enter__()
            if sampler is not None:
                sampler.phase = Phase.FORWARD
            hooks = (
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
                if last
                else contextlib.nullcontext()
            )
            with hooks, _autocast(settings.precision):
                out = model(**inputs)
            if last and micro == 0:
                activations, weight_copies = sum(acts.values()), sum(copies.values())
            del inputs
            if sampler is not None:
                sampler.phase = Phase.BACKWARD
            out.loss.backward()
            acts.clear()
            copies.clear()
        if sampler is not None:
            sampler.phase = Phase.OPTIMIZER
            gradients = _storages_bytes(p.grad for p in model.parameters() if p.grad is not None)
        optimizer.step()
        if sampler is not None:
            sampler.__exit__(None, None, None)
            states = _storages_bytes(t for s in optimizer.state.values() for t in _tensors_in(s))
            result = Measured(
                weights=weights + weight_copies,
                weight_copies=weight_copies,
                gradients=gradients,
                optimizer_states=states,
                activations=activations,
                peak=live_before + max(0, sampler.peak - heap_before),
                peak_phase=sampler.peak_phase,
            )
    assert result is not None
    return result


@pytest.fixture(scope="session")
def real_step() -> Any:
    """``measure_real_step`` (test modules cannot import conftest under --import-mode=importlib)."""
    return measure_real_step


@pytest.fixture(scope="session")
def tiny_configs() -> dict[str, Any]:
    from transformers import BertConfig, GPT2Config, LlamaConfig

    return {
        "bert": BertConfig(
            vocab_size=1000,
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=512,
            max_position_embeddings=128,
        ),
        "gpt2": GPT2Config(vocab_size=1000, n_embd=96, n_layer=2, n_head=2, n_positions=128),
        "llama": LlamaConfig(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
        ),
    }
