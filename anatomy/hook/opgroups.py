"""The guide's operation groups, and a profiler that splits a sampled step's FLOPs and time among them.

``classify`` maps an aten op name to an :class:`OpGroup` with the one table below. ``OpGroupProfiler``
is a ``TorchDispatchMode`` meant for one sampled step: every aten op run inside it is timed and its
FLOPs counted. Measured cost (benchmarks/bench_opgroups.py, CPU): on a small BERT step ~1.05-1.17x the
step's CPU time (torch's own FlopCounterMode: ~1.3x); on a 2-block MLP, 77 ops of a few µs each, 3.2x,
where a dispatch mode that does nothing costs 2.7x (torch's dispatch to Python, ~15-20 µs an op on a slow
CPU): the profiler's own code is ~8 µs an op over that (``bench_dispatch_floor.py``: each op's group and
counter looked up once, its FLOPs counted, one tuple appended).

Backward ops are seen too. On CPU, autograd runs backward on the calling thread. On CUDA it runs on
the engine's per-device threads, but the engine copies the caller's ``at::ThreadLocalState`` into each
graph task, and that state carries the ``TorchDispatchModeTLS`` stack, so the mode is active there as
well (this is what lets ``FlopCounterMode`` count backward FLOPs on GPUs). Ops can therefore arrive from
another thread: each op's accounting is one ``list.append`` of one tuple (atomic under the GIL), summed
per group once the profiler is done — no lock and no dictionary per op (3.7 µs an op less than a lock and
four dictionary updates, on a 2-block MLP's 89 ops).

Normalizations written as element-wise Python (LlamaRMSNorm's pow, mean, rsqrt, mul) are told apart by
module: while a leaf module whose class name ends in "Norm" runs forward (hooks on the norm modules of
the modules the profiler is given, installed only while it is active), its non-contraction ops are
NORMALIZATION; the autograd nodes it
created form a range of sequence numbers, and a backward op whose current autograd node
(``torch._C._current_autograd_node()``) falls in such a range is NORMALIZATION too. Such ops keep
their own per-element FLOP estimate.

FLOPs: contractions (and attention kernels) use ``torch.utils.flop_counter``'s formulas, so totals
agree with ``FlopCounterMode``; we add the CPU flash-attention kernel it does not know. Other ops are
estimated from the number of output elements:
  - element-wise and reductions: ELEMENTWISE_FLOPS_PER_ELEMENT (1) per output element (per input
    element for reductions, where the output is small);
  - normalizations: NORMALIZATION_FLOPS_PER_ELEMENT (5): softmax is max, subtract, exp, sum, divide;
    layer norm is mean, subtract, square-and-sum, scale, affine;
  - fused optimizer kernels: FUSED_ADAM_FLOPS_PER_ELEMENT (12) per parameter element;
  - other ops (views, copies, gathers, embedding lookups, losses) count 0: they move data.
These are ~0.3% of a transformer's FLOPs; the estimates only have to be the right order of magnitude.

Time: on CPU, ``perf_counter`` around each op. On CUDA, a pair of ``torch.cuda.Event`` around each op on
the current stream; ``result()`` returns None until the last events have completed (``Event.query()``,
never a synchronize), then sums ``elapsed_time`` per group. An op's event interval includes the kernel
launch latency, so tiny kernels are over-counted by a few microseconds each.
"""

from __future__ import annotations

import bisect
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from anatomy.hook.op_flops import Counter, counter_for
from anatomy.protocol import OpGroupStat
from anatomy.vocabulary import OpGroup, Phase

# ---------------------------------------------------------------------------------------------
# The one table: base op name (no "aten.", no overload, no trailing "_" of in-place ops, no
# "_backward"/"_backward_data" suffix) -> group. Prefix and substring rules follow it.

_CONTRACTIONS = frozenset(
    {
        "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "einsum", "_scaled_mm",
        "_int_mm", "mv", "addmv", "dot", "vdot", "tensordot", "addr", "outer", "_addmm_activation",
        "mkldnn_linear", "_weight_int4pack_mm", "_weight_int8pack_mm", "flex_attention",
    }
)  # fmt: skip
_CONTRACTION_PREFIXES = (
    "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose", "conv_tbc",
    "conv_depthwise", "cudnn_convolution", "miopen_convolution",
    "mkldnn_convolution", "_slow_conv", "slow_conv", "thnn_conv", "_nnpack_spatial_convolution",
    "_flash_attention", "_efficient_attention", "_cudnn_attention", "_fused_attention",
)  # fmt: skip
_CONTRACTION_SUBSTRINGS = ("scaled_dot_product",)

_NORMALIZATIONS = frozenset(
    {
        "_softmax", "softmax", "_safe_softmax", "_log_softmax", "log_softmax", "_masked_softmax",
        "native_layer_norm", "layer_norm", "native_batch_norm", "batch_norm", "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training", "_native_batch_norm_legit_functional",
        "_batch_norm_with_update", "_batch_norm_no_update", "_batch_norm_impl_index", "cudnn_batch_norm",
        "miopen_batch_norm", "batch_norm_update_stats", "native_group_norm", "group_norm",
        "instance_norm", "_fused_rms_norm", "rms_norm", "_fused_layer_norm", "local_response_norm",
    }
)  # fmt: skip

_ELEMENTWISE = frozenset(
    {
        # arithmetic
        "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow",
        "neg", "abs", "sign", "reciprocal", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log", "log1p",
        "log2", "log10", "square", "addcmul", "addcdiv", "lerp", "clamp", "clamp_min", "clamp_max",
        "clip", "minimum", "maximum", "floor", "ceil", "round", "trunc", "frac", "erf", "erfc", "erfinv",
        "sin", "cos", "tan", "atan", "atan2", "asin", "acos", "sinh", "cosh", "hypot", "xlogy",
        # activations
        "relu", "relu6", "leaky_relu", "gelu", "tanh", "sigmoid", "silu", "mish", "elu", "selu", "celu",
        "hardtanh", "hardswish", "hardsigmoid", "softplus", "softshrink", "hardshrink", "threshold",
        "glu", "prelu", "_prelu_kernel", "logit", "log_sigmoid", "log_sigmoid_forward", "rrelu_with_noise",
        # masks and dropout
        "where", "masked_fill", "masked_scale", "_masked_scale", "dropout", "native_dropout",
        "_fused_dropout", "feature_dropout", "alpha_dropout", "bernoulli", "rand_like", "uniform",
        "normal", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not",
        "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not", "isnan", "isinf", "isfinite",
        "nan_to_num",
        # reductions: memory-bound like element-wise ops (bias gradients, loss means, norms)
        "sum", "mean", "prod", "amax", "amin", "max", "min", "var", "std", "var_mean", "std_mean",
        "norm", "linalg_vector_norm", "cumsum", "logsumexp", "argmax", "argmin",
    }
)  # fmt: skip

_OPTIMIZER_PREFIXES = ("_foreach_", "_fused_adam", "_fused_sgd", "_fused_adagrad")

_NAMESPACES = frozenset({"torch", "ops", "aten", "prims", "prim", "quantized", "_c10d_functional", "c10d"})


def base_name(op_name: str) -> str:
    """``"aten.addmm.default"``, ``"aten::addmm"``, ``"addmm"`` -> ``"addmm"``; ``"mul_"`` -> ``"mul"``;
    ``"native_layer_norm_backward"`` -> ``"native_layer_norm"``."""
    name = op_name.strip()
    if "::" in name:
        name = name.rsplit("::", 1)[1]
    parts = [p for p in name.split(".") if p]
    while len(parts) > 1 and parts[0] in _NAMESPACES:
        parts = parts[1:]
    name = parts[0] if parts else ""
    for suffix in ("_backward_data", "_backward_input", "_backward_weight", "_backward"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    # In-place variants (mul_) share the group of the functional op; dunder names keep theirs.
    if name.endswith("_") and not name.endswith("__") and len(name) > 1:
        name = name[:-1]
    return name


def _classify_base(name: str) -> OpGroup:
    if name.startswith(_OPTIMIZER_PREFIXES):
        return OpGroup.OPTIMIZER
    if (
        name in _CONTRACTIONS
        or name.startswith(_CONTRACTION_PREFIXES)
        or any(s in name for s in _CONTRACTION_SUBSTRINGS)
    ):
        return OpGroup.CONTRACTION
    if name in _NORMALIZATIONS:
        return OpGroup.NORMALIZATION
    if name in _ELEMENTWISE:
        return OpGroup.ELEMENTWISE
    return OpGroup.OTHER


_CACHE: dict[str, OpGroup] = {}


def classify(op_name: str) -> OpGroup:
    """The operation group of an aten op (``"aten.addmm.default"`` or ``"addmm"``). Ops that only
    exist for optimizers (``_foreach_*``, ``_fused_adamw_``) are OPTIMIZER; other ops an optimizer
    runs (``addcmul_``, ``lerp_``) are element-wise by name and attributed to OPTIMIZER by the
    profiler when the tracker says the optimizer phase is on."""
    group = _CACHE.get(op_name)
    if group is None:
        group = _classify_base(base_name(op_name))
        if len(_CACHE) < 4096:
            _CACHE[op_name] = group
    return group


_SEQUENCE_NR: Callable[[], int] | None = getattr(torch._C._autograd, "_get_sequence_nr", None)
_current_autograd_node: Callable[[], Any] = getattr(torch._C, "_current_autograd_node", lambda: None)
_NORM_MODULE_RE = re.compile(r"Norm(?:\d+d)?$")
_NORM_TYPES: dict[type, bool] = {}


def _is_norm_module(module: torch.nn.Module) -> bool:
    """LayerNorm, LlamaRMSNorm, BatchNorm2d, GroupNorm, ...: leaf modules named *Norm. A wrapper with
    children (a "PreNorm" block around attention) is not one."""
    cls = type(module)
    named = _NORM_TYPES.get(cls)
    if named is None:
        named = _NORM_TYPES[cls] = bool(_NORM_MODULE_RE.search(cls.__name__))
    return named and not module._modules


def _device_of(args: tuple[Any, ...]) -> torch.device | None:
    """The CUDA device of the op's first tensor argument; None where that is not on CUDA (host-timed)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device if a.is_cuda else None
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return a[0].device if a[0].is_cuda else None
    return None


# Ops that only ask tensor metadata: FlopCounterMode skips them too; they are not work.
_METADATA_OPS = frozenset(
    {"is_contiguous", "sym_is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense",
     "size", "sym_size", "stride", "sym_stride", "storage_offset", "sym_storage_offset", "numel",
     "sym_numel", "dim", "layout", "device"}
)  # fmt: skip

# Per op seen (keyed by id: an op's own __hash__ is Python code, a call per lookup; the op itself is kept
# in the entry, so its id is never another's): the op, its group, its base name and how to count its
# FLOPs (None: a metadata op, not work). Ops are the process's own singletons: one entry each, shared by
# every profiler.
_PLANS: dict[int, tuple[Any, OpGroup, str, Counter | None]] = {}
_NO_KWARGS: dict[str, Any] = {}  # (read only: a counter given no keyword arguments)
_now = time.perf_counter
_MAX_PLANS = 8192


def _unknown_flops(args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> float:
    # (each call counts 0 and an error, as a failing formula does)
    raise LookupError("no FLOP counter for this op")


def _plan(func: Any) -> tuple[Any, OpGroup, str, Counter | None]:
    name = base_name(str(func))
    group = _classify_base(name)
    counter: Counter | None = None
    if name not in _METADATA_OPS:
        try:
            counter = counter_for(func, group, name)
        except Exception:  # (inside the user's op: never in its way)
            counter = _unknown_flops
    plan = (func, group, name, counter)
    if len(_PLANS) < _MAX_PLANS:
        _PLANS[id(func)] = plan
    return plan


class OpGroupProfiler(TorchDispatchMode):
    """FLOPs and time per operation group for everything run inside ``with profiler:``.

    Use on a sampled step only. ``set_phase(Phase.OPTIMIZER)`` (the tracker calls it from the
    optimizer's step pre-hook) attributes every following op to OPTIMIZER until another phase is set.
    Accounting errors never reach the training step: a failing FLOP formula counts 0.
    """

    def __init__(
        self,
        modules: Iterable[torch.nn.Module] = (),
        hook: Callable[[Any], Any] = lambda f: f,
        cuda: bool = True,
    ) -> None:
        """``modules``: where to look for normalization modules to watch; ``hook`` wraps each module hook
        (the tracker keeps them out of compiled graphs); ``cuda``: an op may run on a GPU (False: every op
        is timed on the host, no device looked up)."""
        super().__init__()
        self._norm_modules = [m for m in modules if _is_norm_module(m)]
        self._wrap_hook = hook
        self._cuda = cuda
        self._lock = threading.Lock()  # (result(): the sums, once)
        self._phase = Phase.FORWARD
        # Per op: (group, FLOPs, host seconds; None: timed by CUDA events, in _pending).
        self._log: list[tuple[OpGroup, float, float | None]] = []
        # CUDA: (group, start event, end event) waiting for the device; the last end event per stream.
        self._pending: list[tuple[OpGroup, Any, Any]] = []
        self._last_events: dict[Any, Any] = {}
        self._result: dict[OpGroup, OpGroupStat] | None = None
        self._exited = False
        self.errors = 0
        # Normalization modules written as element-wise Python (LlamaRMSNorm: pow, mean, rsqrt, mul):
        # while one runs forward, _norm_depth > 0; the autograd nodes it created (a range of the
        # thread's sequence numbers) mark its backward ops.
        self._norm_depth = 0
        self._norm_start = 0
        self._norm_starts: list[int] = []
        self._norm_ends: list[int] = []
        self._hook_handles: list[Any] = []

    # -- the tracker's side -----------------------------------------------------------------

    def set_phase(self, phase: Phase) -> None:
        self._phase = phase

    @property
    def op_count(self) -> int:
        return len(self._log)

    @property
    def total_flops(self) -> float:
        return sum(flops for _, flops, _ in self._log)

    def _sums(self) -> tuple[dict[OpGroup, float], dict[OpGroup, float], set[OpGroup]]:
        """FLOPs and host seconds per group, and every group an op was counted in."""
        flops: dict[OpGroup, float] = {}
        times: dict[OpGroup, float] = {}
        for group, f, elapsed in list(self._log):
            flops[group] = flops.get(group, 0.0) + f
            if elapsed is not None:
                times[group] = times.get(group, 0.0) + elapsed
        return flops, times, set(flops)

    @property
    def norm_forwards(self) -> int:  # normalization forwards seen (their backward ops are normalization)
        return len(self._norm_starts)

    @property
    def model_flops(self) -> float:
        """FLOPs of the model's forward and backward (all groups but the optimizer): MFU's numerator."""
        return sum(f for g, f, _ in self._log if g is not OpGroup.OPTIMIZER)

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Any other dispatch mode makes Dynamo skip a compiled frame, and torch then runs it eagerly
        # for good; this one sees the ops of compiled code that run through the dispatcher.
        return True

    def __enter__(self) -> OpGroupProfiler:
        self._install_norm_hooks()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self.end()

    def watch(self, modules: Iterable[torch.nn.Module]) -> None:
        """Watch these modules' normalizations too (before the profiler starts)."""
        self._norm_modules += [m for m in modules if _is_norm_module(m)]

    def begin(self) -> None:
        """The norm watch on, not the mode (a piece of a step pushes it: :mod:`anatomy.hook.pieces`)."""
        self._install_norm_hooks()

    def end(self) -> None:
        """Done (after ``begin``, or as ``__exit__`` ends): the watch off, the results readable."""
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles = []
        self._exited = True

    def _install_norm_hooks(self) -> None:
        if _SEQUENCE_NR is None or not self._norm_modules:
            return
        enter, leave = self._wrap_hook(self._norm_enter), self._wrap_hook(self._norm_exit)
        try:
            for module in self._norm_modules:
                self._hook_handles.append(module.register_forward_pre_hook(enter))
                self._hook_handles.append(module.register_forward_hook(leave, always_call=True))
        except Exception:  # older torch without always_call: name-based classification only
            for handle in self._hook_handles:
                handle.remove()
            self._hook_handles = []
            self.errors += 1

    def _norm_enter(self, module: torch.nn.Module, args: Any) -> None:
        if _is_norm_module(module):
            if self._norm_depth == 0:
                self._norm_start = _SEQUENCE_NR()  # type: ignore[misc]
            self._norm_depth += 1

    def _norm_exit(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if _is_norm_module(module) and self._norm_depth > 0:
            self._norm_depth -= 1
            if self._norm_depth == 0:
                end = _SEQUENCE_NR()  # type: ignore[misc]
                # Ranges stay sorted for bisect; a range from another thread's counter (a checkpointed
                # forward recomputed on a CUDA autograd thread) that would break the order is dropped.
                if end > self._norm_start and (
                    not self._norm_ends or self._norm_start >= self._norm_ends[-1]
                ):
                    self._norm_starts.append(self._norm_start)
                    self._norm_ends.append(end)

    def _in_norm_backward(self) -> bool:
        try:
            node = _current_autograd_node()
            if node is None:
                return False
            seq = node._sequence_nr()
        except Exception:
            return False
        i = bisect.bisect_right(self._norm_starts, seq) - 1
        return i >= 0 and seq < self._norm_ends[i]

    def result(self) -> dict[OpGroup, OpGroupStat] | None:
        """Per group FLOPs and seconds for the profiled region; None while the profiler is still
        active or CUDA work it timed has not completed (poll again later: this never blocks)."""
        if self._result is not None:
            return self._result
        if not self._exited:
            return None
        with self._lock:
            flops, host, groups = self._sums()
            times = dict(host)
            if self._pending:
                try:
                    if not all(ev.query() for ev in self._last_events.values()):
                        return None
                    for group, start, end in self._pending:
                        times[group] = times.get(group, 0.0) + start.elapsed_time(end) / 1000.0
                except Exception:  # a device error: report FLOPs without device times
                    self.errors += 1
                    times = dict(host)
                self._pending = []
                self._last_events = {}
            self._result = {
                g: OpGroupStat(flops=flops.get(g, 0.0), time_s=times.get(g, 0.0))
                for g in OpGroup
                if g in groups
            }
        return self._result

    # -- the dispatch mode --------------------------------------------------------------------

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        plan = _PLANS.get(id(func))
        if plan is None:
            plan = _plan(func)
        counter = plan[3]
        if counter is None:
            return func(*args, **kwargs) if kwargs else func(*args)
        device = _device_of(args) if self._cuda else None
        start = None
        if device is not None:
            try:
                stream = torch.cuda.current_stream(device)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record(stream)
            except Exception:  # e.g. inside CUDA graph capture: fall back to host time
                start = None
                self.errors += 1
        elapsed: float | None
        if start is not None:
            out = func(*args, **kwargs) if kwargs else func(*args)
            try:
                end.record(stream)
                elapsed = None
            except Exception:
                start = None
                elapsed = 0.0
                self.errors += 1
        else:
            t0 = _now()
            out = func(*args, **kwargs) if kwargs else func(*args)
            elapsed = _now() - t0
        try:
            flops = counter(args, kwargs or _NO_KWARGS, out)
        except Exception:
            flops = 0.0
            self.errors += 1
        group = plan[1]
        if self._phase is Phase.OPTIMIZER:
            group = OpGroup.OPTIMIZER
        elif group is not OpGroup.CONTRACTION and (
            self._norm_depth > 0 or (self._norm_starts and self._in_norm_backward())
        ):
            group = OpGroup.NORMALIZATION
        if start is not None:
            self._pending.append((group, start, end))
            self._last_events[stream] = end
        self._log.append((group, flops, elapsed))
        return out
