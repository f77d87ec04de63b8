"""Independent measurement of a real CPU training step, for checking `anatomy.plan` against.

Nothing here uses the planner's machinery: weights, gradients and optimizer states are sums of
``numel * element_size`` over real tensors; activations are what ``saved_tensors_hooks`` sees during
the real forward (storage-deduplicated by data pointer, parameters excluded, autocast's weight copies
recognised by value: equal to a parameter cast to their dtype); the peak is glibc's in-use heap
(``mallinfo2``) read after every aten op of the step, on top of the tensor bytes alive before it.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import ctypes.util
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

# TorchDispatchMode has no public name in torch (the plan's own timeline subclasses it too).
from torch.utils._python_dispatch import TorchDispatchMode

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
        self.phase_peaks: dict[Phase, int] = {}
        self.paused = False

    def sample(self) -> None:
        if self.paused:
            return
        now = heap_in_use()
        if now > self.peak:
            self.peak, self.peak_phase = now, self.phase
        if now > self.phase_peaks.get(self.phase, 0):
            self.phase_peaks[self.phase] = now

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


def tensors_in(value: Any, _seen: set[int] | None = None) -> list[torch.Tensor]:
    """Every tensor reachable from ``value``: model outputs, tuples, dicts and plain objects such as
    transformers' caches (a DynamicCache holds its keys and values in ``layers[i].keys/.values``)."""
    seen = set() if _seen is None else _seen
    if id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (str, bytes, int, float, bool, type(None), torch.device, torch.dtype)):
        return []
    if isinstance(value, dict) or (hasattr(value, "values") and callable(value.values)):
        try:
            items = list(value.values())
        except Exception:
            items = []
        return [t for v in items for t in tensors_in(v, seen)]
    if isinstance(value, (list, tuple, set)):
        return [t for v in value for t in tensors_in(v, seen)]
    if hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):
        return [t for v in vars(value).values() for t in tensors_in(v, seen)]
    return []


def _cache_of(out: Any) -> Any:
    for key in ("past_key_values", "cache"):
        cache = out.get(key) if hasattr(out, "get") else None
        if cache is not None:
            return cache
    return None


@dataclass
class Measured:
    weights: int  # parameters + buffers + autocast weight copies
    weight_copies: int
    gradients: int
    optimizer_states: int
    activations: int
    peak: int
    peak_phase: Phase
    phase_peaks: dict[Phase, int]  # each phase's own peak (bytes live on top of nothing: whole step)
    kv_cache: int  # bytes of the cache the forward returned (0: none)
    inputs: dict[str, Any]  # the last micro-batch's inputs, for reports


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


TEXT_TASKS = ("causal-lm", "masked-lm", "sequence-classification", "seq2seq-lm")


def _auto_class(task: str) -> Any:
    import transformers

    return {
        "causal-lm": transformers.AutoModelForCausalLM,
        "masked-lm": transformers.AutoModelForMaskedLM,
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "seq2seq-lm": transformers.AutoModelForSeq2SeqLM,
        "image-classification": transformers.AutoModelForImageClassification,
        "speech-seq2seq": transformers.AutoModelForSpeechSeq2Seq,
    }[task]


def real_config(config: Any, task: str, use_cache: bool | None) -> Any:
    """The config a user would train: classification needs a pad token for batches > 1, T5-style
    seq2seq a decoder start token; ``use_cache`` as the user set it (None: the config's own)."""
    cfg = copy.deepcopy(config)
    if getattr(cfg, "pad_token_id", None) is None and task == "sequence-classification":
        eos = getattr(cfg, "eos_token_id", None)
        cfg.pad_token_id = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    if task in ("seq2seq-lm", "speech-seq2seq") and getattr(cfg, "decoder_start_token_id", None) is None:
        cfg.decoder_start_token_id = getattr(cfg, "pad_token_id", None) or 0
    if use_cache is not None:
        cfg.use_cache = use_cache
    return cfg


def _lengths(batch: int, seq: int) -> list[int]:
    """A padded batch: every row shorter than the padded length (a batch of one padded to a fixed
    length too), down to about half."""
    return [max(1, seq - ((b + 1) * seq) // (2 * batch)) for b in range(batch)]


def real_inputs(
    config: Any,
    task: str,
    batch: int,
    seq: int,
    *,
    padded: bool,
    target_len: int | None = None,
    image_size: int | None = None,
    accepts_interpolation: bool = False,
    audio_frames: int | None = None,
) -> dict[str, Any]:
    """A real batch as a data collator builds it: token ids with right padding, an attention mask
    with zeros on the padding, labels of -100 there (ignored by the loss); or images and class ids;
    or log-mel features (``audio_frames`` of them; default Whisper's window, twice the encoder's
    positions) and label tokens."""
    if task == "speech-seq2seq":
        frames = audio_frames or 2 * int(config.max_source_positions)
        tgt = target_len or seq
        labels = torch.randint(min(100, config.vocab_size - 1), config.vocab_size, (batch, tgt))
        if padded:
            for b, length in enumerate(_lengths(batch, tgt)):
                labels[b, length:] = -100
        return {"input_features": torch.randn(batch, int(config.num_mel_bins), frames), "labels": labels}
    if task == "image-classification":
        size = image_size or int(config.image_size)
        channels = int(getattr(config, "num_channels", 3))
        inputs: dict[str, Any] = {
            "pixel_values": torch.randn(batch, channels, size, size),
            "labels": torch.zeros(batch, dtype=torch.long),
        }
        if accepts_interpolation and size != int(config.image_size):
            inputs["interpolate_pos_encoding"] = True
        return inputs
    vocab = int(config.vocab_size)
    pad = getattr(config, "pad_token_id", None) or 0
    ids = torch.randint(min(100, vocab - 1), vocab, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    if padded:
        for b, length in enumerate(_lengths(batch, seq)):
            mask[b, length:] = 0
            ids[b, length:] = pad
    inputs = {"input_ids": ids}
    if padded:
        inputs["attention_mask"] = mask
    if task == "sequence-classification":
        inputs["labels"] = torch.zeros(batch, dtype=torch.long)
    elif task == "seq2seq-lm":
        tgt = target_len or seq
        labels = torch.randint(min(100, vocab - 1), vocab, (batch, tgt))
        if padded:
            for b, length in enumerate(_lengths(batch, tgt)):
                labels[b, length:] = -100
        inputs["labels"] = labels
    else:
        inputs["labels"] = ids.masked_fill(mask == 0, -100)
    return inputs


def quantized_weight_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """What bitsandbytes keeps beside a quantized layer's packed weight: every tensor of its
    QuantState (nested state included) and LLM.int8()'s row scales. Neither parameters nor buffers,
    but memory the weights take."""
    found: list[torch.Tensor] = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)
        if state is not None:
            found += tensors_in(vars(state))
        scb = getattr(weight, "SCB", None)
        if isinstance(scb, torch.Tensor):
            found.append(scb)
    return found


def measure_real_step(
    config: Any,
    task: str,
    settings: Any,
    steps: int = 3,
    build: Callable[[Any], torch.nn.Module] | None = None,
    **overrides: Any,
) -> Measured:
    """Train ``steps`` real steps on CPU as a plain loop does (``out = model(...)`` held until the
    next forward returns); measure the last one. ``settings`` is a PlanSettings; ``overrides``
    (padded, use_cache, target_len, image_size) replace or supply its fields; ``build`` makes the
    model from the prepared config (a PEFT-wrapped or quantized one; default: the task's Auto class)."""

    def get(name: str, default: Any) -> Any:
        return overrides.get(name, getattr(settings, name, default))

    use_cache = get("use_cache", None)
    padded = get("padded", None)
    if padded is None:  # the plan's default: a padded batch for token inputs
        padded = task in TEXT_TASKS
    seq = get("seq_len", None) or 512
    target_len, image_size = get("target_len", None), get("image_size", None)
    torch.manual_seed(0)
    cfg = real_config(config, task, use_cache)
    model = build(cfg) if build is not None else _auto_class(task).from_config(cfg)
    model.train()
    if settings.gradient_checkpointing:
        enable = (
            getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        )
        enable()
    accepts_interpolation = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters
    optimizer = make_optimizer(settings.optimizer, model)
    params = {p.untyped_storage().data_ptr(): p for p in model.parameters()}
    weights = _storages_bytes(
        list(model.parameters()) + list(model.buffers()) + quantized_weight_tensors(model)
    )
    out: Any = None
    result: Measured | None = None
    for step in range(steps):
        last = step == steps - 1
        optimizer.zero_grad(set_to_none=True)
        acts: dict[int, int] = {}
        copies: dict[int, int] = {}
        sampler = HeapPeak() if last else None

        savers: dict[int, list[weakref.ref[torch.Tensor]]] = {}

        def pack(
            t: torch.Tensor,
            acts: dict[int, int] = acts,
            copies: dict[int, int] = copies,
            savers: dict[int, list[weakref.ref[torch.Tensor]]] = savers,
            sampler: HeapPeak | None = sampler,
        ) -> torch.Tensor:
            # Only sizes are kept: holding the tensors would keep them alive through backward.
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in params:
                return t
            if key in acts or key in copies:
                if any(ref() is not None for ref in savers[key]):
                    savers[key].append(weakref.ref(t))
                    return t
                # Every tensor saved at this address is gone: the allocator gave it to a new storage
                # (a saved tensor whose node the forward dropped). Both were saved: both count.
                gone = -len(savers) - 1
                for kinds in (acts, copies):
                    if key in kinds:
                        kinds[gone] = kinds.pop(key)
                savers[gone] = savers.pop(key)
            savers[key] = [weakref.ref(t)]
            if sampler is not None:
                sampler.paused = True
            with torch.no_grad():
                # A copy may be saved as a view (a transposed weight): compare whole storages. Autocast
                # copies are floating point: an integer tensor (DeepSeek-V3's routing indices, all 0)
                # would equal a small-valued weight truncated to integers.
                flat = torch.empty(0, dtype=t.dtype).set_(st)
                is_copy = t.is_floating_point() and any(
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
        kv_cache = 0
        for micro in range(settings.grad_accum):
            inputs = real_inputs(
                cfg,
                task,
                settings.batch_size,
                seq,
                padded=padded,
                target_len=target_len,
                image_size=image_size,
                accepts_interpolation=accepts_interpolation,
                audio_frames=overrides.get("audio_frames"),
            )
            if sampler is not None and micro == 0:
                states = _storages_bytes(t for s in optimizer.state.values() for t in tensors_in(s))
                held = _storages_bytes(tensors_in(out)) if out is not None else 0
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
                if sampler is not None:
                    sampler.paused = True
                kv_cache = _storages_bytes(tensors_in(_cache_of(out)))
                if sampler is not None:
                    sampler.paused = False
            last_inputs = inputs
            del inputs
            if sampler is not None:
                sampler.phase = Phase.BACKWARD
            out.loss.backward()
            acts.clear()
            copies.clear()
            savers.clear()
        if sampler is not None:
            sampler.phase = Phase.OPTIMIZER
            gradients = _storages_bytes(p.grad for p in model.parameters() if p.grad is not None)
        optimizer.step()
        if sampler is not None:
            sampler.__exit__(None, None, None)
            states = _storages_bytes(t for s in optimizer.state.values() for t in tensors_in(s))
            result = Measured(
                weights=weights + weight_copies,
                weight_copies=weight_copies,
                gradients=gradients,
                optimizer_states=states,
                activations=activations,
                peak=live_before + max(0, sampler.peak - heap_before),
                peak_phase=sampler.peak_phase,
                phase_peaks={
                    phase: live_before + max(0, value - heap_before)
                    for phase, value in sampler.phase_peaks.items()
                },
                kv_cache=kv_cache,
                inputs={
                    k: tuple(v.shape) if isinstance(v, torch.Tensor) else v for k, v in last_inputs.items()
                },
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
