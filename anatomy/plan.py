"""Pre-flight anatomy: predict a training step's memory before running it (`anatomy-top plan`).

The model is built from its transformers config under torch's FakeTensorMode (tensors with shapes and
dtypes, no storage) and one training step is *run*: forward (with autocast for mixed precision) and
backward execute the model's real code, so what is saved for backward, what checkpointing recomputes
and what the loss allocates are the model's own, not a formula. Three instruments watch the run:

* a TorchDispatchMode sees every new storage an op creates; a weakref on the storage sees it freed.
  Replaying those events gives the live bytes after every op — the step's memory timeline;
* ``saved_tensors_hooks`` around forward mark the storages kept for backward (storage-deduplicated,
  parameters and autocast's low-precision weight copies excluded): the hook's "activations";
* the storages that end up as ``param.grad`` are the gradients.

Everything live at a moment is one of: weights (parameters, buffers, autocast weight copies), gradients,
activations (saved for backward), or temporaries (all else: layer outputs not saved, loss buffers,
gradients of activations in flight). Optimizer states and the optimizer step's own temporaries are
computed from the parameter shapes (the step's arithmetic needs real values); see
``optimizer_state_bytes`` and ``optimizer_step_temporary_bytes`` for the model of each optimizer.

Target device. ``target="cpu"`` reproduces a CPU run exactly (the fake tensors are CPU tensors; the
accuracy tests compare against real CPU runs). ``target="cuda"`` (the default) models what CUDA kernels
keep instead: dropout keeps a 1-byte mask (``native_dropout``) rather than CPU's float noise tensor,
attention runs the fused memory-efficient kernel (saves the output and a logsumexp row, not the
seq x seq probabilities; ``fused_attention=False`` models unfused attention), mixed precision follows
CUDA autocast's float32 policy for softmax / log_softmax / layer_norm, allocations are rounded to the
caching allocator's 512-byte blocks, AdamW is torch's default foreach implementation (or
``optimizer_impl``), plus the guide's CUDA context figure and an allocator headroom calibrated on the
guide's four BERT-large runs (which the plan reproduces within 11%: tests/plan/test_plan_guide.py).

Steady state. The plan is of a step after the first: optimizer states exist before forward, and
gradients are set to None between steps (zero_grad's default). With gradient accumulation a second
micro-batch runs with the gradients already present. The training loop is assumed to hold the model
outputs (``out = model(...)``) until the optimizer step (``keep_outputs``), as a plain loop does.

Depth. A deep model (more than 6 layers) is run at 1 and 2 layers (p and 2p when ``config.layer_types``
repeats with period p) and every layer-dependent figure is extrapolated linearly: the layers are
identical, so the activations, peaks and temporaries of L layers are a + b*L exactly — the tests check
it against full-depth runs (``exact_depth=True`` runs all layers). Weights, gradients and optimizer
states always come from the full model, built on the meta device.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from anatomy import gpus, techniques
from anatomy.techniques import GUIDE_CUDA_CONTEXT_BYTES
from anatomy.vocabulary import (
    Component,
    OptimizerKind,
    Phase,
    Precision,
    Source,
    expected_bytes_per_param,
)

MIB = 1 << 20
OPTIMIZERS: tuple[str, ...] = ("adamw", "adamw-8bit", "sgd", "adafactor", "adafactor-torch")
TASKS: tuple[str, ...] = ("causal-lm", "sequence-classification", "masked-lm")
TARGETS: tuple[str, ...] = ("cuda", "cpu")
OPTIMIZER_KINDS: dict[str, OptimizerKind] = {
    "adamw": OptimizerKind.ADAMW,
    "adamw-8bit": OptimizerKind.ADAMW_8BIT,
    "sgd": OptimizerKind.SGD_MOMENTUM,
    "adafactor": OptimizerKind.ADAFACTOR,
    "adafactor-torch": OptimizerKind.ADAFACTOR,
}
CUDA_BLOCK = 512  # the CUDA caching allocator rounds every allocation up to 512 bytes
# The caching allocator's reserve beyond the peak (cache and fragmentation), as a share of the bytes
# that churn every step (activations + temporaries at the peak). Calibrated on the guide's four
# BERT-large V100 runs (nvidia-smi: baseline, gradient accumulation, checkpointing, fp16), which
# this plan then reproduces within ~11% (tests/plan/test_plan_guide.py); a prediction, not a rule.
ALLOCATOR_HEADROOM = 0.35
BNB_MIN_8BIT_SIZE = 4096  # bitsandbytes keeps 32-bit states for smaller tensors
BNB_BLOCK = 256  # bitsandbytes blockwise quantization: one fp32 absmax per 256 values
_EXTRAPOLATE_ABOVE = 6


def layer_period(config: Any) -> int:
    """How many layers repeat (1 for identical layers; e.g. 2 for alternating sliding/global attention,
    from ``config.layer_types``)."""
    types = getattr(config, "layer_types", None)
    if not isinstance(types, list) or not types:
        return 1
    for period in range(1, len(types) + 1):
        if all(types[i] == types[i % period] for i in range(len(types))):
            return period
    return len(types)


class PlanError(Exception):
    """A plan that cannot be made (bad config path, unsupported model or setting): its text is for users."""


@dataclass(frozen=True)
class PlanSettings:
    batch_size: int = 4  # per micro-batch (per_device_train_batch_size)
    seq_len: int = 512
    precision: Precision = Precision.FP32
    optimizer: str = "adamw"
    gradient_checkpointing: bool = False
    grad_accum: int = 1
    task: str | None = None  # None: from config.architectures
    target: str = "cuda"
    keep_outputs: bool = True
    exact_depth: bool = False
    fused_attention: bool = True  # CUDA target: SDPA runs a fused kernel (False: the math path, probs saved)
    optimizer_impl: str | None = None  # AdamW: foreach | fused | for-loop (None: torch's default)


# ---------------------------------------------------------------------------------------------
# Loading a config


def load_config(model: str) -> Any:
    """A transformers config from a directory holding config.json, a config.json path, or a hub id."""
    from transformers import AutoConfig

    path = Path(model).expanduser()
    try:
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise PlanError(f"{model}: directory has no config.json")
            return AutoConfig.from_pretrained(str(path))
        if path.is_file():
            return AutoConfig.from_pretrained(str(path))
    except PlanError:
        raise
    except Exception as exc:
        raise PlanError(f"{model}: not a usable transformers config ({type(exc).__name__}: {exc})") from None
    if path.suffix == ".json" or model.startswith((".", "/", "~")):
        raise PlanError(f"{model}: no such file")
    with contextlib.suppress(Exception):  # a hub config already in the local cache
        return AutoConfig.from_pretrained(model, local_files_only=True)
    try:
        if not hub_reachable():
            raise OSError("the hub is not reachable from here")
        return AutoConfig.from_pretrained(model)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PlanError(
            f"{model}: not a local directory or config.json, and the Hugging Face hub did not provide it "
            f"(offline or unknown id: {first[:200]}). "
            "Pass a directory with config.json or a config.json path."
        ) from None


def hub_reachable(timeout: float = 2.0) -> bool:
    """A quick TCP check of the Hugging Face endpoint, so an offline machine fails in seconds rather
    than after the hub client's retries."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def default_task(config: Any) -> str:
    archs = [a.lower() for a in (getattr(config, "architectures", None) or [])]
    for arch in archs:
        if "forcausallm" in arch or "lmheadmodel" in arch:
            return "causal-lm"
        if "formaskedlm" in arch or "forpretraining" in arch:
            return "masked-lm"
        if "forsequenceclassification" in arch:
            return "sequence-classification"
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", "")
    if (
        model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    ):
        return "causal-lm"
    return "sequence-classification"  # the guide's example: BERT with a classification head


def _auto_class(task: str) -> Any:
    import transformers

    return {
        "causal-lm": transformers.AutoModelForCausalLM,
        "sequence-classification": transformers.AutoModelForSequenceClassification,
        "masked-lm": transformers.AutoModelForMaskedLM,
    }[task]


def prepare_config(config: Any, task: str) -> Any:
    """The config the plan builds (also what tests build their real model from)."""
    cfg = copy.deepcopy(config)
    if task == "sequence-classification" and getattr(cfg, "pad_token_id", None) is None:
        # Decoder models refuse batches > 1 for classification without a pad token.
        eos = getattr(cfg, "eos_token_id", None)
        cfg.pad_token_id = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    return cfg


def build_model(config: Any, task: str) -> Any:
    model = _auto_class(task).from_config(config)
    return model


def enable_checkpointing(model: Any) -> None:
    """Per-layer activation checkpointing, as transformers does it (renamed in transformers 5)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise PlanError(f"{type(model).__name__} does not support gradient checkpointing")
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def num_layers(config: Any) -> int | None:
    for attr in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _with_depth(config: Any, depth: int) -> Any:
    cfg = copy.deepcopy(config)
    cfg.num_hidden_layers = depth
    layer_types = getattr(cfg, "layer_types", None)
    if isinstance(layer_types, list) and layer_types:
        cfg.layer_types = layer_types[:depth]
    return cfg


def make_inputs(config: Any, task: str, batch: int, seq: int, device: str | torch.device = "cpu") -> dict:
    vocab = int(getattr(config, "vocab_size", 30000) or 30000)
    low = min(100, vocab - 1)
    ids = torch.randint(low, vocab, (batch, seq), device=device)
    if task == "sequence-classification":
        labels = torch.zeros(batch, dtype=torch.long, device=device)
    else:
        labels = ids.clone()
    return {"input_ids": ids, "labels": labels}


# ---------------------------------------------------------------------------------------------
# Model states from shapes


@dataclass(frozen=True)
class ModelStates:
    model_class: str
    parameter_count: int
    trainable_count: int
    param_bytes: int
    buffer_bytes: int
    grad_bytes: int
    largest_param_bytes: int
    shapes: tuple[tuple[tuple[int, ...], int], ...]  # (shape, element size) of each trainable parameter
    vocab_size: int | None
    depth: int | None


def model_states(model: Any, config: Any) -> ModelStates:
    seen: set[int] = set()
    params: list[torch.Tensor] = []
    for p in model.parameters():
        key = p.untyped_storage()._cdata
        if key not in seen:
            seen.add(key)
            params.append(p)
    buffers = []
    for b in model.buffers():
        key = b.untyped_storage()._cdata
        if key not in seen:
            seen.add(key)
            buffers.append(b)
    trainable = [p for p in params if p.requires_grad]
    nbytes = [p.numel() * p.element_size() for p in trainable]
    return ModelStates(
        model_class=type(model).__name__,
        parameter_count=sum(p.numel() for p in params),
        trainable_count=sum(p.numel() for p in trainable),
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        buffer_bytes=sum(b.numel() * b.element_size() for b in buffers),
        grad_bytes=sum(nbytes),
        largest_param_bytes=max(nbytes, default=0),
        shapes=tuple((tuple(p.shape), p.element_size()) for p in trainable),
        vocab_size=getattr(config, "vocab_size", None),
        depth=num_layers(config),
    )


def _round(nbytes: int, target: str) -> int:
    if target == "cuda" and nbytes > 0:
        return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK
    return nbytes


def optimizer_state_bytes(
    optimizer: str, shapes: tuple[tuple[tuple[int, ...], int], ...], target: str
) -> int:
    """Bytes of every tensor the optimizer keeps, as the implementation allocates them:

    adamw: exp_avg + exp_avg_sq (parameter dtype) + a 0-dim fp32 ``step`` per parameter (torch.optim).
    sgd: one momentum buffer. adafactor (transformers, beta1=None): factored row/column second moments
    for tensors with >= 2 dims, a full second moment otherwise, and the 0-dim RMS tensor (step is a
    Python int). adafactor-torch (torch.optim.Adafactor): the same moments and a 0-dim fp32 step.
    adamw-8bit (bitsandbytes): two uint8 states + one fp32 absmax per 256 values, 32-bit states for
    tensors under 4096 values, and the two shared 256-entry quantization maps.
    """
    r = _round
    total = 0
    for shape, size in shapes:
        numel = math.prod(shape)
        if optimizer == "adamw":
            total += 2 * r(numel * size, target) + r(4, target)
        elif optimizer == "sgd":
            total += r(numel * size, target)
        elif optimizer in ("adafactor", "adafactor-torch"):
            if len(shape) >= 2:
                rows = math.prod(shape[:-1])
                cols = math.prod(shape[:-2]) * shape[-1]
                total += r(rows * size, target) + r(cols * size, target)
            else:
                total += r(numel * size, target)
            total += r(4, target)  # transformers: the 0-dim RMS tensor; torch: the 0-dim step
        elif optimizer == "adamw-8bit":
            if numel < BNB_MIN_8BIT_SIZE:
                total += 2 * r(numel * 4, target)
            else:
                blocks = -(-numel // BNB_BLOCK)
                total += 2 * r(numel, target) + 2 * r(blocks * 4, target)
        else:
            raise PlanError(f"unknown optimizer {optimizer!r} (one of {', '.join(OPTIMIZERS)})")
    if optimizer == "adamw-8bit" and shapes:
        total += 2 * r(256 * 4, target)
    return total


def optimizer_step_temporary_bytes(
    optimizer: str, states: ModelStates, target: str, impl: str | None = None
) -> int:
    """Transient bytes inside ``optimizer.step()`` beyond the states.

    AdamW depends on torch's implementation (``impl``; default: what torch.optim.AdamW picks — foreach
    on CUDA, the for-loop on CPU): foreach materialises sqrt(exp_avg_sq) for every parameter at once
    (4 bytes/param in fp32); the for-loop keeps sqrt and the division of one parameter alive together
    (2 x the largest); fused (the Trainer's adamw_torch_fused) needs ~0. Adafactor: the squared gradient
    and the update of the largest parameter (2 x largest). SGD with momentum and 8-bit AdamW update in
    place (0).
    """
    if optimizer == "adamw":
        impl = impl or ("foreach" if target == "cuda" else "for-loop")
        if impl == "foreach":
            return states.grad_bytes
        if impl == "fused":
            return 0
        return 2 * states.largest_param_bytes
    if optimizer in ("adafactor", "adafactor-torch"):
        return 2 * states.largest_param_bytes
    return 0


# ---------------------------------------------------------------------------------------------
# The timeline


_PARAM, _COPY, _GRAD, _SAVED, _TEMP = "param", "copy", "grad", "saved", "temp"
_CATEGORIES = (_PARAM, _COPY, _GRAD, _SAVED, _TEMP)


class _Timeline(TorchDispatchMode):
    """Every storage an op creates (alloc event) and frees (weakref callback), in order."""

    def __init__(self, target: str) -> None:
        super().__init__()
        self.target = target
        self.live: dict[int, int] = {}  # storage _cdata -> allocation id
        self.sizes: dict[int, int] = {}  # allocation id -> bytes
        self.events: list[int] = []  # +id alloc, -id free
        self.refs: dict[int, weakref.ref] = {}
        self.param_ids: set[int] = set()
        self.copy_ids: set[int] = set()
        self._next = 1

    def register(self, t: torch.Tensor) -> int:
        st = t.untyped_storage()
        key = st._cdata
        aid = self.live.get(key)
        if aid is not None:
            return aid
        aid = self._next
        self._next += 1
        self.live[key] = aid
        self.sizes[aid] = _round(st.nbytes(), self.target)
        self.events.append(aid)

        def _freed(_ref: object, key: int = key, aid: int = aid) -> None:
            if self.live.get(key) == aid:
                del self.live[key]
                self.events.append(-aid)
            self.refs.pop(aid, None)

        self.refs[aid] = weakref.ref(st, _freed)
        return aid

    def id_of(self, t: torch.Tensor) -> int:
        return self.register(t)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                aid = self.register(t)
                if func is torch.ops.aten._to_copy.default and args and isinstance(args[0], torch.Tensor):
                    src = self.live.get(args[0].untyped_storage()._cdata)
                    if src in self.param_ids:
                        self.copy_ids.add(aid)
        return out


_PATCH_LOCK = threading.Lock()


@contextlib.contextmanager
def _cuda_kernels(fused_attention: bool) -> Iterator[None]:
    """Make fake CPU tensors keep what CUDA kernels keep: dropout's 1-byte mask, fused attention, and
    CUDA autocast's float32 policy for softmax, log_softmax and layer_norm (CPU autocast leaves them in
    half precision; CUDA autocast computes them in, and returns, float32).

    The functions are swapped on ``torch.nn.functional``, ``torch`` and ``torch.Tensor`` for the
    duration of the run (not with a TorchFunctionMode: checkpointing recomputes inside backward, where
    such a mode is not active, and a recompute that differs from the forward is an error). The swap
    is process-wide: do not plan for the CUDA target on one thread while the same process trains on
    another.
    """
    import torch.nn.functional as F

    swaps: list[tuple[Any, str, Any]] = [
        (F, "dropout", _cuda_dropout),
        (F, "scaled_dot_product_attention", _cuda_sdpa if fused_attention else _cuda_sdpa_math),
    ]
    for owner, name in (
        (F, "softmax"),
        (F, "log_softmax"),
        (F, "layer_norm"),
        (torch, "softmax"),
        (torch, "log_softmax"),
        (torch.Tensor, "softmax"),
        (torch.Tensor, "log_softmax"),
    ):
        swaps.append((owner, name, _fp32_under_autocast(getattr(owner, name))))
    with _PATCH_LOCK:
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
        try:
            for owner, name, fn in swaps:
                setattr(owner, name, fn)
            yield
        finally:
            for owner, name, fn in originals:
                setattr(owner, name, fn)


def _fp32_under_autocast(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with CUDA autocast's fp32 policy: half-precision tensor arguments are cast to float32."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.is_autocast_enabled("cpu") and any(
            isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) for a in args
        ):
            args = tuple(
                a.float() if isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16) else a
                for a in args
            )
            with torch.autocast("cpu", enabled=False):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    return run


def _cuda_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    if not training or p == 0.0:
        return input
    return torch.native_dropout(input, p, True)[0]


def _expand_kv_heads(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, enable_gqa: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Grouped-query attention: repeat the key/value heads up to the query heads, as the kernels do."""
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        reps = query.shape[-3] // key.shape[-3]
        return key.repeat_interleave(reps, dim=-3), value.repeat_interleave(reps, dim=-3)
    return key, value


def _cuda_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    key, value = _expand_kv_heads(query, key, value, enable_gqa)
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            bias = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill_(~attn_mask, float("-inf"))
        else:
            bias = attn_mask.to(query.dtype)
        bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, True, dropout_p, is_causal, scale=scale
    )
    return out[0]


def _cuda_sdpa_math(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Unfused attention as CUDA runs it: the probabilities are saved, their dropout keeps a 1-byte mask."""
    key, value = _expand_kv_heads(query, key, value, enable_gqa)
    scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(query, key.transpose(-2, -1)) * scale
    if is_causal:
        s_q, s_k = query.shape[-2], key.shape[-2]
        causal = torch.ones(s_q, s_k, dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        scores = (
            scores.masked_fill(~attn_mask, float("-inf"))
            if attn_mask.dtype == torch.bool
            else scores + attn_mask
        )
    probs = torch.softmax(scores, dim=-1)
    probs = _cuda_dropout(probs, dropout_p, True)
    return torch.matmul(probs, value)


@dataclass
class StepProfile:
    """One step's forward and backward (micro-batches included), without optimizer states."""

    activations: int  # saved for backward at the end of forward (max over micro-batches)
    weight_copies: int  # autocast's low-precision weight copies alive at the end of forward
    forward_peak: int
    forward_at_peak: dict[str, int]
    backward_peak: int
    backward_at_peak: dict[str, int]
    kept_after_backward: int  # temporaries still alive when backward ends (outputs the loop holds)
    params_in_run: int
    depth: int | None
    extrapolated_from: tuple[int, int] | None = None

    def scaled(self, other: StepProfile, factor: float) -> StepProfile:
        """self + (other - self) * factor, field by field (linear extrapolation in depth or batch)."""

        def lin(a: int, b: int) -> int:
            return max(0, round(a + (b - a) * factor))

        return StepProfile(
            activations=lin(self.activations, other.activations),
            weight_copies=lin(self.weight_copies, other.weight_copies),
            forward_peak=lin(self.forward_peak, other.forward_peak),
            forward_at_peak={k: lin(self.forward_at_peak[k], other.forward_at_peak[k]) for k in _CATEGORIES},
            backward_peak=lin(self.backward_peak, other.backward_peak),
            backward_at_peak={
                k: lin(self.backward_at_peak[k], other.backward_at_peak[k]) for k in _CATEGORIES
            },
            kept_after_backward=lin(self.kept_after_backward, other.kept_after_backward),
            params_in_run=lin(self.params_in_run, other.params_in_run),
            depth=self.depth,
        )


def _autocast(precision: Precision) -> contextlib.AbstractContextManager:
    if precision is Precision.BF16_MIXED:
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if precision is Precision.FP16_MIXED:
        return torch.autocast("cpu", dtype=torch.float16)
    return contextlib.nullcontext()


def _loss_of(out: Any) -> torch.Tensor:
    loss = out["loss"] if isinstance(out, dict) or hasattr(out, "keys") else out[0]
    if loss is None:
        raise PlanError("the model returned no loss for these labels")
    return loss


def run_step_profile(config: Any, task: str, settings: PlanSettings) -> StepProfile:
    """Run forward + backward of ``config``'s model on fake tensors and replay the memory timeline."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    if settings.precision not in (Precision.FP32, Precision.FP16_MIXED, Precision.BF16_MIXED):
        raise PlanError(f"precision {settings.precision.value} is not planned (fp32, fp16 or bf16 mixed)")
    timeline = _Timeline(settings.target)
    saved: set[int] = set()
    marks: list[tuple[int, tuple[str, int]]] = []
    micro_batches = 2 if settings.grad_accum > 1 else 1
    fwd_end_ids: list[set[int]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.add(timeline.id_of(t))
        return t

    with FakeTensorMode(), warnings_off():
        model = build_model(config, task)
        model.train()
        if settings.gradient_checkpointing:
            enable_checkpointing(model)
        params = {p.untyped_storage()._cdata: p for p in model.parameters()}
        params.update({b.untyped_storage()._cdata: b for b in model.buffers()})
        kernels = (
            _cuda_kernels(settings.fused_attention) if settings.target == "cuda" else contextlib.nullcontext()
        )
        with timeline, kernels:
            for t in params.values():
                timeline.param_ids.add(timeline.register(t))
            params_in_run = sum(timeline.sizes[i] for i in timeline.param_ids)
            prev: Any = None  # the previous micro-batch's outputs, as a loop variable holds them
            for mb in range(micro_batches):
                inputs = make_inputs(config, task, settings.batch_size, settings.seq_len)
                marks.append((len(timeline.events), ("forward", mb)))
                with (
                    torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
                    _autocast(settings.precision),
                ):
                    out = model(**inputs)
                prev = None
                loss = _loss_of(out)
                fwd_end_ids.append(set(timeline.live.values()))
                marks.append((len(timeline.events), ("backward", mb)))
                if not settings.keep_outputs:
                    out = None
                del inputs
                loss.backward()
                marks.append((len(timeline.events), ("end", mb)))
                prev = (out, loss)
                del out, loss
            grad_ids = {timeline.id_of(p.grad) for p in model.parameters() if p.grad is not None}
            kept_ids = set(timeline.live.values())
            del prev

    # Replay.
    def category(aid: int) -> str:
        if aid in timeline.param_ids:
            return _PARAM
        if aid in timeline.copy_ids:
            return _COPY
        if aid in grad_ids:
            return _GRAD
        if aid in saved:
            return _SAVED
        return _TEMP

    sizes = timeline.sizes
    cats = {aid: category(aid) for aid in sizes}
    totals = dict.fromkeys(_CATEGORIES, 0)
    peaks: dict[tuple[str, int], tuple[int, dict[str, int]]] = {}
    mark_at = dict(marks)
    phase: tuple[str, int] = ("forward", 0)
    live_total = 0
    for idx, ev in enumerate(timeline.events):
        if idx in mark_at and mark_at[idx][0] != "end":
            phase = mark_at[idx]
        aid = abs(ev)
        delta = sizes[aid] if ev > 0 else -sizes[aid]
        totals[cats[aid]] += delta
        live_total += delta
        if live_total > peaks.get(phase, (-1,))[0]:
            peaks[phase] = (live_total, totals.copy())
    kept = sum(sizes[i] for i in kept_ids if cats[i] == _TEMP)
    # In steady state the previous step's outputs are still bound to the loop variable while the
    # first micro-batch's forward runs (later micro-batches ran with them in the replay already).
    if ("forward", 0) in peaks:
        top, cat = peaks[("forward", 0)]
        peaks[("forward", 0)] = (top + kept, {**cat, _TEMP: cat[_TEMP] + kept})
    empty = (0, dict.fromkeys(_CATEGORIES, 0))

    def phase_peak(name: str) -> tuple[int, dict[str, int]]:
        return max((v for k, v in peaks.items() if k[0] == name), key=lambda v: v[0], default=empty)

    fwd_peak, bwd_peak = phase_peak("forward"), phase_peak("backward")
    activations = max((sum(sizes[i] for i in ids if cats[i] == _SAVED) for ids in fwd_end_ids), default=0)
    copies = max((sum(sizes[i] for i in ids if cats[i] == _COPY) for ids in fwd_end_ids), default=0)
    return StepProfile(
        activations=activations,
        weight_copies=copies,
        forward_peak=fwd_peak[0],
        forward_at_peak=fwd_peak[1],
        backward_peak=bwd_peak[0],
        backward_at_peak=bwd_peak[1],
        kept_after_backward=kept,
        params_in_run=params_in_run,
        depth=num_layers(config),
    )


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    import logging
    import warnings

    tlog = logging.getLogger("transformers")
    level = tlog.level
    tlog.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tlog.setLevel(level)


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass
class PlanResult:
    model: str
    model_class: str
    task: str
    settings: PlanSettings
    parameter_count: int
    trainable_parameters: int
    components: dict[Component, int | None]  # each at its own maximum (what the hook reports)
    sources: dict[Component, Source]
    at_peak: dict[Component, int]  # what is live at the predicted peak (sums to peak_bytes)
    peak_bytes: int  # tensors only (CUDA: torch.cuda.max_memory_allocated)
    peak_phase: Phase
    phase_peaks: dict[Phase, int]
    total_bytes: int  # peak + CUDA context + allocator headroom
    gpu_name: str | None
    gpu_bytes: int | None
    gpu_source: str
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def fits(self) -> bool | None:
        return None if self.gpu_bytes is None else self.total_bytes <= self.gpu_bytes

    @property
    def spare_bytes(self) -> int | None:
        return None if self.gpu_bytes is None else self.gpu_bytes - self.total_bytes

    @property
    def optimizer_kind(self) -> OptimizerKind:
        return OPTIMIZER_KINDS[self.settings.optimizer]

    def expected_bytes_per_param(self) -> dict[Component, float | None]:
        return {
            c: expected_bytes_per_param(c, self.settings.precision, self.optimizer_kind)
            for c in self.components
        }

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "model": self.model,
            "model_class": self.model_class,
            "task": self.task,
            "settings": {
                "batch_size": s.batch_size,
                "seq_len": s.seq_len,
                "precision": s.precision.value,
                "optimizer": s.optimizer,
                "gradient_checkpointing": s.gradient_checkpointing,
                "grad_accum": s.grad_accum,
                "target": s.target,
                "keep_outputs": s.keep_outputs,
                "fused_attention": s.fused_attention,
                "optimizer_impl": s.optimizer_impl,
            },
            "parameter_count": self.parameter_count,
            "trainable_parameters": self.trainable_parameters,
            "components": {
                c.value: {
                    "bytes": v,
                    "label": c.label,
                    "source": self.sources[c].value,
                    "bytes_per_param": (v / self.parameter_count)
                    if v is not None and self.parameter_count
                    else None,
                    "guide_bytes_per_param": self.expected_bytes_per_param().get(c),
                }
                for c, v in self.components.items()
            },
            "at_peak": {c.value: v for c, v in self.at_peak.items()},
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase.value,
            "phase_peaks": {p.value: v for p, v in self.phase_peaks.items()},
            "total_bytes": self.total_bytes,
            "gpu": {"name": self.gpu_name, "bytes": self.gpu_bytes, "source": self.gpu_source},
            "fits": self.fits,
            "spare_bytes": self.spare_bytes,
            "notes": list(self.notes),
            "elapsed_s": round(self.elapsed_s, 3),
        }


class Planner:
    """Plans for one model config; caches the model's states and each step profile it ran."""

    def __init__(self, config: Any, task: str | None = None, name: str = "model") -> None:
        if getattr(config, "is_encoder_decoder", False):
            raise PlanError(
                f"{name}: encoder-decoder models ({getattr(config, 'model_type', '?')}) are not planned; "
                f"tasks: {', '.join(TASKS)}"
            )
        self.task = task or default_task(config)
        if self.task not in TASKS:
            raise PlanError(f"unknown task {self.task!r} (one of {', '.join(TASKS)})")
        self.config = prepare_config(config, self.task)
        self.name = name
        self._states: ModelStates | None = None
        self._profiles: dict[tuple, StepProfile] = {}

    @property
    def states(self) -> ModelStates:
        if self._states is None:
            try:
                with torch.device("meta"), warnings_off():
                    model = build_model(self.config, self.task)
            except Exception as exc:
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                raise PlanError(f"could not build {self.name}: {type(exc).__name__}: {first}") from None
            self._states = model_states(model, self.config)
        return self._states

    def profile(self, settings: PlanSettings) -> StepProfile:
        key = (
            settings.batch_size,
            settings.seq_len,
            settings.precision,
            settings.gradient_checkpointing,
            settings.grad_accum > 1,
            settings.target,
            settings.keep_outputs,
            settings.exact_depth,
            settings.fused_attention,
        )
        if key not in self._profiles:
            self._profiles[key] = self._run_profile(settings)
        return self._profiles[key]

    def _run_profile(self, settings: PlanSettings) -> StepProfile:
        depth = num_layers(self.config)
        try:
            period = layer_period(self.config)
            low, high = period, 2 * period
            if depth is None or depth <= max(_EXTRAPOLATE_ABOVE, high) or settings.exact_depth:
                return run_step_profile(self.config, self.task, settings)
            a = run_step_profile(_with_depth(self.config, low), self.task, settings)
            b = run_step_profile(_with_depth(self.config, high), self.task, settings)
            out = a.scaled(b, (depth - low) / (high - low))
            out.depth = depth
            out.extrapolated_from = (low, high)
            return out
        except PlanError:
            raise
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            raise PlanError(
                f"could not run a fake training step of {self.name} ({self.task}): "
                f"{type(exc).__name__}: {first}"
            ) from None

    def plan(
        self, settings: PlanSettings, gpu: str | None = None, gpu_bytes: int | None = None
    ) -> PlanResult:
        started = time.perf_counter()
        _check(settings)
        max_pos = getattr(self.config, "max_position_embeddings", None) or getattr(
            self.config, "n_positions", None
        )
        rope = any(hasattr(self.config, a) for a in ("rope_theta", "rope_parameters", "rope_scaling"))
        if isinstance(max_pos, int) and settings.seq_len > max_pos and not rope:
            raise PlanError(
                f"sequence length {settings.seq_len} exceeds the model's {max_pos} position embeddings"
            )
        return self.assemble(settings, self.profile(settings), gpu, gpu_bytes, started)

    def assemble(
        self,
        settings: PlanSettings,
        prof: StepProfile,
        gpu: str | None = None,
        gpu_bytes: int | None = None,
        started: float | None = None,
    ) -> PlanResult:
        """The plan from a step profile (run, or synthesized by the batch search) and the model states."""
        started = time.perf_counter() if started is None else started
        states = self.states
        target = settings.target
        opt_states = optimizer_state_bytes(settings.optimizer, states.shapes, target)
        opt_temp = optimizer_step_temporary_bytes(settings.optimizer, states, target, settings.optimizer_impl)
        weights = _round_sum(states, target)
        fwd = prof.forward_peak + opt_states
        bwd = prof.backward_peak + opt_states
        opt_peak = weights + prof_grads(states, target) + opt_states + prof.kept_after_backward + opt_temp
        phase_peaks = {Phase.FORWARD: fwd, Phase.BACKWARD: bwd, Phase.OPTIMIZER: opt_peak}
        peak_phase = max(phase_peaks, key=lambda p: phase_peaks[p])
        peak = phase_peaks[peak_phase]
        if peak_phase is Phase.OPTIMIZER:
            at = {
                Component.WEIGHTS: weights,
                Component.OPTIMIZER_STATES: opt_states,
                Component.GRADIENTS: prof_grads(states, target),
                Component.ACTIVATIONS: 0,
                Component.TEMPORARIES: prof.kept_after_backward + opt_temp,
            }
        else:
            cats = prof.forward_at_peak if peak_phase is Phase.FORWARD else prof.backward_at_peak
            at = {
                Component.WEIGHTS: cats[_PARAM] + cats[_COPY],
                Component.OPTIMIZER_STATES: opt_states,
                Component.GRADIENTS: cats[_GRAD],
                Component.ACTIVATIONS: cats[_SAVED],
                Component.TEMPORARIES: cats[_TEMP],
            }
        cuda = target == "cuda"
        context = GUIDE_CUDA_CONTEXT_BYTES if cuda else None
        headroom = (
            round(ALLOCATOR_HEADROOM * (at[Component.ACTIVATIONS] + at[Component.TEMPORARIES]))
            if cuda
            else None
        )
        components: dict[Component, int | None] = {
            Component.CUDA_CONTEXT: context,
            Component.ALLOCATOR_CACHE: headroom,
            Component.WEIGHTS: weights + prof.weight_copies,
            Component.OPTIMIZER_STATES: opt_states,
            Component.GRADIENTS: prof_grads(states, target),
            Component.ACTIVATIONS: prof.activations,
            Component.TEMPORARIES: at[Component.TEMPORARIES],
        }
        sources = {c: Source.PREDICTED for c in components}
        sources[Component.CUDA_CONTEXT] = Source.GUIDE
        total = peak + (context or 0) + (headroom or 0)
        gpu_name, gpu_total, gpu_source = resolve_gpu(gpu, gpu_bytes) if cuda else (None, None, "cpu target")
        notes = self._notes(settings, prof)
        return PlanResult(
            model=self.name,
            model_class=states.model_class,
            task=self.task,
            settings=settings,
            parameter_count=states.parameter_count,
            trainable_parameters=states.trainable_count,
            components=components,
            sources=sources,
            at_peak=at,
            peak_bytes=peak,
            peak_phase=peak_phase,
            phase_peaks=phase_peaks,
            total_bytes=total,
            gpu_name=gpu_name,
            gpu_bytes=gpu_total,
            gpu_source=gpu_source,
            notes=notes,
            elapsed_s=time.perf_counter() - started,
        )

    def _notes(self, settings: PlanSettings, prof: StepProfile) -> list[str]:
        notes = []
        if prof.extrapolated_from:
            lo, hi = prof.extrapolated_from
            notes.append(f"activations and peaks extrapolated linearly from {lo}- and {hi}-layer runs")
        if settings.target == "cuda":
            notes.append(
                "CUDA kernels modelled: 1-byte dropout masks, "
                + ("fused (memory-efficient) attention" if settings.fused_attention else "unfused attention")
                + ", autocast's fp32 softmax/layer_norm, 512-byte allocator blocks; CUDA context is the "
                f"guide's {GUIDE_CUDA_CONTEXT_BYTES // MIB} MiB; allocator headroom "
                f"{ALLOCATOR_HEADROOM:.0%} of activations + temporaries (calibrated on the guide's runs)"
            )
        if settings.optimizer == "adamw" and settings.target == "cuda" and settings.optimizer_impl is None:
            notes.append(
                "AdamW step modelled as torch's foreach default (+4 B/param transient); "
                "--optimizer-impl fused (the Trainer's default) needs ~0"
            )
        if settings.grad_accum > 1:
            notes.append(
                f"gradient accumulation x{settings.grad_accum}: effective batch "
                f"{settings.batch_size * settings.grad_accum}"
            )
        return notes

    def savings(self, settings: PlanSettings) -> dict[str, int]:
        """Technique key -> bytes of peak the technique alone would save (the advisor's ``savings``)."""
        base = self.plan(settings).peak_bytes
        out: dict[str, int] = {}
        for key, variant in _single_techniques(settings):
            out[key] = max(0, base - self.plan(variant).peak_bytes)
        return out


def _round_sum(states: ModelStates, target: str) -> int:
    if target != "cuda":
        return states.param_bytes + states.buffer_bytes
    # Each parameter and buffer is its own allocation; round each one.
    return states.param_bytes + states.buffer_bytes + _rounding_slack(states)


def _rounding_slack(states: ModelStates) -> int:
    slack = 0
    for shape, size in states.shapes:
        n = math.prod(shape) * size
        slack += _round(n, "cuda") - n
    return slack


def prof_grads(states: ModelStates, target: str) -> int:
    return states.grad_bytes + (_rounding_slack(states) if target == "cuda" else 0)


def _check(settings: PlanSettings) -> None:
    if settings.batch_size < 1 or settings.seq_len < 1 or settings.grad_accum < 1:
        raise PlanError("batch size, sequence length and gradient accumulation must be >= 1")
    if settings.optimizer not in OPTIMIZERS:
        raise PlanError(f"unknown optimizer {settings.optimizer!r} (one of {', '.join(OPTIMIZERS)})")
    if settings.target not in TARGETS:
        raise PlanError(f"unknown target {settings.target!r} (one of {', '.join(TARGETS)})")


def resolve_gpu(gpu: str | None, gpu_bytes: int | None = None) -> tuple[str | None, int | None, str]:
    """(name, total bytes, where it came from): --gpu, else NVML's first GPU, else the guide's V100."""
    if gpu_bytes is not None:
        return gpu or "custom", gpu_bytes, "given"
    if gpu:
        total = gpus.gpu_memory_bytes(gpu)
        if total is None:
            raise PlanError(f"unknown GPU {gpu!r}: one of {', '.join(gpus.names())}, or a size like 24GiB")
        return gpus.canonical_name(gpu) or gpu, total, "--gpu"
    found = nvml_gpu()
    if found is not None:
        return found[0], found[1], "NVML"
    return gpus.DEFAULT_GPU, gpus.GPU_MEMORY[gpus.DEFAULT_GPU], "default (the guide's GPU; pass --gpu)"


@functools.lru_cache(maxsize=1)
def nvml_gpu() -> tuple[str, int] | None:
    """Name and total memory of GPU 0 from NVML, or None when there is no driver. Never raises.
    Read once per process: a plan with its technique table resolves the GPU many times."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
    name = name.decode() if isinstance(name, bytes) else str(name)
    return name, total


# ---------------------------------------------------------------------------------------------
# Techniques and the largest batch


@dataclass
class TechniqueRow:
    label: str
    keys: tuple[str, ...]
    settings: PlanSettings
    result: PlanResult | None
    speed_factor: float | None
    speed_source: str
    note: str = ""

    @property
    def fits(self) -> bool | None:
        return None if self.result is None else self.result.fits


def _grad_accum_variant(settings: PlanSettings) -> PlanSettings | None:
    """Same effective batch in k micro-batches (the guide: batch 4 -> 1 x 4)."""
    if settings.grad_accum > 1 or settings.batch_size < 2:
        return None
    k = min(4, settings.batch_size)
    while settings.batch_size % k:
        k -= 1
    return replace(settings, batch_size=settings.batch_size // k, grad_accum=k)


def _single_techniques(settings: PlanSettings) -> list[tuple[str, PlanSettings]]:
    out: list[tuple[str, PlanSettings]] = []
    accum = _grad_accum_variant(settings)
    if accum is not None:
        out.append((techniques.GRAD_ACCUM, accum))
    if not settings.gradient_checkpointing:
        out.append((techniques.CHECKPOINTING, replace(settings, gradient_checkpointing=True)))
    if settings.precision is Precision.FP32:
        out.append((techniques.MIXED_PRECISION, replace(settings, precision=Precision.BF16_MIXED)))
    if settings.optimizer == "adamw":
        out.append((techniques.ADAMW_8BIT, replace(settings, optimizer="adamw-8bit")))
        out.append((techniques.ADAFACTOR, replace(settings, optimizer="adafactor")))
    return out


def technique_table(
    planner: Planner, settings: PlanSettings, gpu: str | None = None, gpu_bytes: int | None = None
) -> list[TechniqueRow]:
    """Baseline, each technique alone, and the fastest combination that fits (guide speed factors)."""
    rows = [TechniqueRow("baseline", (), settings, planner.plan(settings, gpu, gpu_bytes), 1.0, "baseline")]
    for key, variant in _single_techniques(settings):
        tech = techniques.TECHNIQUES[key]
        label = tech.label
        if key == techniques.GRAD_ACCUM:
            label += f" ({variant.batch_size} x {variant.grad_accum})"
        rows.append(
            TechniqueRow(
                label,
                (key,),
                variant,
                planner.plan(variant, gpu, gpu_bytes),
                tech.speed_factor,
                tech.source_label if tech.speed_factor is not None else "no guide figure",
            )
        )
    best = best_combination(planner, settings, gpu, gpu_bytes)
    if best is not None:
        rows.append(best)
    return rows


def best_combination(
    planner: Planner, settings: PlanSettings, gpu: str | None = None, gpu_bytes: int | None = None
) -> TechniqueRow | None:
    """The combination that fits with the best guide speed factor (a technique without a guide figure
    counts as 1.0); ties go to fewer techniques, then to less memory. The baseline itself is a
    candidate: when it fits, nothing slower is recommended."""
    singles = dict(_single_techniques(settings))
    keys = list(singles)
    candidates: list[TechniqueRow] = []
    for mask in range(1 << len(keys)):
        chosen = tuple(k for i, k in enumerate(keys) if mask >> i & 1)
        if techniques.ADAMW_8BIT in chosen and techniques.ADAFACTOR in chosen:
            continue
        variant = settings
        for k in chosen:
            single = singles[k]
            if k == techniques.GRAD_ACCUM:
                variant = replace(variant, batch_size=single.batch_size, grad_accum=single.grad_accum)
            elif k == techniques.CHECKPOINTING:
                variant = replace(variant, gradient_checkpointing=True)
            elif k == techniques.MIXED_PRECISION:
                variant = replace(variant, precision=single.precision)
            else:
                variant = replace(variant, optimizer=single.optimizer)
        result = planner.plan(variant, gpu, gpu_bytes)
        factor = techniques.combined_speed_factor(chosen) if chosen else 1.0
        names = " + ".join(techniques.TECHNIQUES[k].label for k in chosen) or "baseline as is"
        candidates.append(
            TechniqueRow(
                "best combination: " + names,
                chosen,
                variant,
                result,
                factor,
                ("product of guide factors (estimate)" if chosen else "baseline")
                if factor is not None
                else "no guide figure",
            )
        )
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        return None
    return max(
        fitting,
        key=lambda c: (
            c.speed_factor if c.speed_factor is not None else 1.0,
            -len(c.keys),
            -(c.result.total_bytes if c.result else 0),
        ),
    )


@dataclass
class BatchSearch:
    batch_size: int | None  # None: not even batch 1 fits
    result: PlanResult | None  # the verified plan at batch_size
    per_sample_bytes: int
    evaluations: int


def largest_batch(
    planner: Planner,
    settings: PlanSettings,
    gpu: str | None = None,
    gpu_bytes: int | None = None,
    limit: int = 1 << 16,
) -> BatchSearch:
    """Largest micro-batch that fits. Every batch-dependent figure of a step is linear in the batch, so
    the step is run at batch 1 and 2 only; any other batch is assembled from their extrapolation
    (microseconds each) and binary-searched. The answer is then verified with a run of its own, and
    stepped down (by the same model) until a run confirms it fits."""
    one_settings = replace(settings, batch_size=1)
    one = planner.plan(one_settings, gpu, gpu_bytes)
    if one.gpu_bytes is None:
        raise PlanError("no GPU memory to fit against")
    evaluations = 1
    if not one.fits:
        return BatchSearch(None, one, 0, evaluations)
    p1 = planner.profile(one_settings)
    p2 = planner.profile(replace(settings, batch_size=2))
    evaluations += 1

    def predicted(b: int) -> PlanResult:
        return planner.assemble(replace(settings, batch_size=b), p1.scaled(p2, b - 1), gpu, gpu_bytes)

    two = predicted(2)
    # Bytes one more sample adds to the step (its activation-side peak), even where the optimizer
    # step is the overall peak and the total does not move yet.
    per_sample = max(
        0,
        max(two.phase_peaks[p] - one.phase_peaks[p] for p in (Phase.FORWARD, Phase.BACKWARD)),
        two.total_bytes - one.total_bytes,
    )
    lo, hi = 1, limit
    while lo < hi:  # largest b whose predicted plan fits
        mid = (lo + hi + 1) // 2
        if predicted(mid).fits:
            lo = mid
        else:
            hi = mid - 1
    best_b, best = 1, one
    guess = lo
    for _ in range(4):
        if guess <= 1:
            break
        res = planner.plan(replace(settings, batch_size=guess), gpu, gpu_bytes)
        evaluations += 1
        if res.fits:
            best_b, best = guess, res
            break
        over = res.total_bytes - (res.gpu_bytes or 0)
        guess -= max(1, -(-over // per_sample) if per_sample else 1)
    return BatchSearch(best_b, best, per_sample, evaluations)


def plan(model: str, settings: PlanSettings, gpu: str | None = None) -> PlanResult:
    """One plan for a model path or hub id (the CLI's default output)."""
    config = load_config(model)
    return Planner(config, settings.task, name=model).plan(settings, gpu)


__all__ = [
    "OPTIMIZERS",
    "TASKS",
    "BatchSearch",
    "ModelStates",
    "PlanError",
    "PlanResult",
    "PlanSettings",
    "Planner",
    "StepProfile",
    "TechniqueRow",
    "best_combination",
    "build_model",
    "default_task",
    "largest_batch",
    "load_config",
    "make_inputs",
    "model_states",
    "optimizer_state_bytes",
    "optimizer_step_temporary_bytes",
    "plan",
    "prepare_config",
    "resolve_gpu",
    "run_step_profile",
    "technique_table",
]
