"""The in-process hook: ``tracker = anatomy.track(model, optimizer)``.

Phase boundaries come from hooks — the model's forward pre/post hooks and the optimizer's step
pre/post hooks — so the same code serves a plain loop and the Hugging Face Trainer. Step
boundaries come from ``tracker.step()`` / ``begin_step``/``end_step`` (or the Trainer callback); a
loop that uses neither still gets steps: a training-mode forward begins one and the optimizer step
ends it.

Every step measures cheaply (saved-tensor counting in the forward, an allocator reading at each
phase boundary, a clock mark); what runs when is :mod:`anatomy.hook.schedule`'s.

What a snapshot's numbers mean. ``memory`` holds each component at its own maximum in the step:
weights (parameters + buffers, plus autocast's low-precision weight copies), optimizer states and
gradients are exact tensor sums; activations are the bytes saved for backward by one forward (the
largest micro-batch). ``peak_bytes`` is the step's peak of memory in use — on CUDA the caching
allocator's peak allocated bytes; on CPU glibc's heap in use at the peak, absolute (read at the phase
boundaries, and after every op on traced steps) — and ``peak_phase`` where it happened.
``at_peak`` splits that peak into what each component held at its moment, summing to ``peak_bytes``
exactly: unattributed is what was in use at the step's start besides weights, optimizer states and
gradients (on CPU: the interpreter, libraries, the batch; constant through the step); weights,
optimizer states, gradients and activations are what was alive at the peak (the per-op trace of a
sampled step knows the moment: saved tensors still held, gradients made so far; between traces the
last traced split stands, ``at_peak_step`` says from which step); temporaries are the rest.

Nothing raised in here reaches the training loop: a failing measurement is logged once, becomes
unmeasured (None) and the snapshot's ``error`` says why (:mod:`anatomy.hook.guard`). Only the user's
own exceptions propagate.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch

from anatomy import advisor
from anatomy.hook import zero as zero_opt
from anatomy.hook.assembly import (
    SnapshotFacts,
    StepFacts,
    batch_size,
    memory_result,
    repeat,
    snapshot,
    stamp,
    unmeasured,
)
from anatomy.hook.backend import CudaBackend, HeapBackend, MemoryBackend
from anatomy.hook.changes import ModelWatch, OptimizerWatch
from anatomy.hook.compiled import CompileProbe, compile_in_use, outside_compile
from anatomy.hook.cuda import CudaAllocator
from anatomy.hook.detect import active_autocast_dtype, detect_optimizer, detect_precision, is_oom
from anatomy.hook.distributed import Buckets, communication_bytes, ddp_buckets
from anatomy.hook.gradients import GradientWatcher
from anatomy.hook.guard import Feature, Guard
from anatomy.hook.heap import HostHeap
from anatomy.hook.held import Held
from anatomy.hook.hello import build_hello
from anatomy.hook.opgroups import OpGroupProfiler
from anatomy.hook.others import OtherModels
from anatomy.hook.paged import paged_state_bytes
from anatomy.hook.publishing import Channel
from anatomy.hook.quantized import weight_quantization
from anatomy.hook.record import MemoryResult, StepRecord, Sums
from anatomy.hook.saved import SavedTensorCounter
from anatomy.hook.saved_values import input_storage_keys
from anatomy.hook.schedule import (
    COUNT,
    HEAP,
    LOOK,
    REFRESH,
    SAMPLE_EVERY,
    SAMPLED,
    WARMUP_REFRESH_STEPS,
    Schedule,
)
from anatomy.hook.split import explained_after_optimizer, held_after_optimizer, step_parts, traced_split
from anatomy.hook.tensors import (
    dominant_dtype,
    gradient_bytes,
    optimizer_state_bytes,
    parameter_count,
    storage_key,
    unwrap_optimizer,
    weight_bytes,
)
from anatomy.hook.throughput import Throughput
from anatomy.hook.timing import (
    BACKWARD_END,
    BEGIN,
    END,
    FORWARD_POST,
    FORWARD_PRE,
    OPTIMIZER_POST,
    OPTIMIZER_PRE,
    StepClock,
)
from anatomy.hook.trace import MemoryTrace
from anatomy.protocol import Hello, Snapshot, Suggestion
from anatomy.recorder import RecordSetting
from anatomy.vocabulary import (
    MODEL_COMPONENTS,
    MemorySource,
    OptimizerKind,
    Phase,
    Precision,
    expected_bytes_per_param,
)

HISTORY_LENGTH = 120


log = logging.getLogger("anatomy")
UNSEEN_UPDATES_WARNING = 3  # updates without any step seen before the tracker says so, once
MAX_MERGED_BLOCKS = 4096  # blocks without an optimizer update merged into one step, at most
_DISCARDED = RuntimeError("trailing micro-batches without an optimizer update")


def _plus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def _wrap_closure(tracker: Tracker, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any] | None:
    """``(args, kwargs)`` with the optimizer step's closure wrapped to tell ``tracker`` when it starts
    and returns; None when the step has no closure."""
    if "closure" in kwargs:
        closure = kwargs["closure"]
        if not callable(closure):
            return None
        return args, {**kwargs, "closure": _TrackedClosure(tracker, closure)}
    # torch passes the hooks the step's positional arguments with the optimizer first
    if len(args) > 1 and callable(args[1]) and not isinstance(args[0], torch.Tensor):
        return (args[0], _TrackedClosure(tracker, args[1]), *args[2:]), kwargs
    return None


class _TrackedClosure:
    """Calls the user's closure exactly as the optimizer would; marks its start and its return."""

    __slots__ = ("_closure", "_tracker")

    def __init__(self, tracker: Tracker, closure: Callable[..., Any]) -> None:
        self._tracker = weakref.ref(tracker)
        self._closure = closure

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tracker = self._tracker()
        if tracker is not None:
            tracker.closure_begin()  # (never raises: guarded inside)
        result = self._closure(*args, **kwargs)
        if tracker is not None:
            tracker.closure_end()
        return result


def hook_disabled() -> bool:
    return os.environ.get("ANATOMY_TOP", "").strip().lower() in ("0", "false", "no", "off")


def _first_tensor(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    for key in ("input_ids", "inputs_embeds", "pixel_values", "input_values", "x", "input"):
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor):
            return value
    for value in args:
        if isinstance(value, torch.Tensor):
            return value
    return None


class _StepContext:
    __slots__ = ("_entered", "_samples", "_tokens", "_tracker")

    def __init__(self, tracker: Tracker, samples: int | None, tokens: int | None) -> None:
        self._tracker = tracker
        self._samples = samples
        self._tokens = tokens
        self._entered = False

    def __enter__(self) -> Tracker:
        self._entered = True
        self._tracker.begin_step(samples=self._samples, tokens=self._tokens)
        return self._tracker

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        self._entered = False
        self._tracker.end_step(exc)
        return False  # the user's exception, if any, propagates unchanged


class _NullContext:
    __slots__ = ("_tracker",)

    def __init__(self, tracker: Tracker) -> None:
        self._tracker = tracker

    def __enter__(self) -> Tracker:
        return self._tracker

    def __exit__(self, *exc: object) -> Literal[False]:
        return False


class Tracker:
    """Measures each training step of ``model`` (and ``optimizer``) and publishes a snapshot per step.

    Use ``with tracker.step(samples=..., tokens=...):`` around each optimizer step (or
    ``begin_step``/``end_step``), then ``close()`` (or use the tracker as a context manager).
    A tracker with ``enabled=False`` (``ANATOMY_TOP=0``, or a set-up that failed) is a null tracker:
    the same API, nothing attached, nothing measured.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Any = None,
        *,
        publish: bool = True,
        interval_s: float = 0.5,
        sample_every: int = SAMPLE_EVERY,
        samples: int | None = None,
        tokens: int | None = None,
        grad_accum_steps: int = 1,
        precision: Precision | None = None,
        directory: Path | None = None,
        enabled: bool = True,
        record: RecordSetting = None,
        others: Mapping[str, torch.nn.Module] | None = None,
    ) -> None:
        self.enabled = enabled
        self.model = model
        self.interval_s = float(interval_s)
        self.grad_accum_steps = max(int(grad_accum_steps or 1), 1)
        self.history: deque[Snapshot] = deque(maxlen=HISTORY_LENGTH)
        self._guard = Guard()
        self._schedule = Schedule(sample_every, self.interval_s)
        self._throughput = Throughput(self._guard, self._schedule, samples, tokens)
        self._channel = Channel(
            self._guard, enabled=publish, interval_s=self.interval_s, directory=directory, record=record
        )
        self._sums = Sums()
        self._precision_override = precision
        self._optimizer_ref: weakref.ref[Any] | None = None  # weak: a replaced optimizer must die
        self._zero_ref: weakref.ref[Any] | None = None  # DeepSpeed's ZeRO optimizer around it, if any
        self._zero_grads_begin = 0  # its gradient buffers at the last measured step's start (stage 3's stay)
        self._managed = 0  # paged optimizer states in CUDA managed memory (anatomy.hook.paged)
        # Further optimizers stepped in the same training step (a GAN's generator and discriminator).
        self._extra_optimizers: list[weakref.ref[Any]] = []
        self._forced_refresh = -1  # a step whose sums are re-taken whatever the schedule (a change)
        self._quiet_until = 0  # steps before this one are ordinary (Schedule.quiet_until)
        self._looked_at = 0  # the last step that compared the model's parameters in full
        self._kind_of: tuple[Any, OptimizerKind] | None = None
        self._hello_stale = False  # the hello changed since the publisher last got it
        self._opt_handles: list[Any] = []
        self._handles: list[Any] = []
        self._step: StepRecord | None = None
        self._finished: StepRecord | None = None  # the last finished step (an OOM record is built from it)
        self._explicit = False
        self._unseen_updates = 0  # optimizer updates with no step around them (a forward never seen)
        self._closed = False
        self._steps_done = 0
        self._seq = 0
        self._latest: Snapshot | None = None
        self._unpublished = False  # the latest snapshot has not gone to the publisher (a failed step)
        self._last_built = 0.0
        self._built_stamp: tuple[Any, ...] | None = None  # the stamp of the last step built in full
        self._balance_logged = False  # the named tensors exceeded a peak: said once
        self._built_errors = 0  # the guard's version then
        self._hello: Hello | None = None
        self._batch_shape: tuple[int, ...] | None = None  # the first batch tensor's, for `plan --like`
        self._started_at = time.time()
        self._suggestions: list[Suggestion] = []
        self._advised_at = -1e9
        self._expected: (
            tuple[tuple[Precision, OptimizerKind, float, bool], dict[str, float | None]] | None
        ) = None
        self._autocast_dtype: torch.dtype | None = None
        self._grad_scaler = False
        self._oom_recorded: int | None = None
        self._oom_path: Path | None = None
        self._device: torch.device | None = None
        self._cuda_events = False  # phase times from CUDA events, else the host clock
        self._heap: HostHeap | None = None
        self._memory: MemoryBackend | None = None
        self._param_count = 0
        self._param_dtype = torch.float32
        self._trainable_count = 0
        self._quantization: str | None = None
        self._others = OtherModels()
        for name, module in (others or {}).items():
            if isinstance(module, torch.nn.Module):
                self._others.add(name, module)
        self._compile_safe = False  # the hooks are wrapped to run outside compiled frames
        self._compiled = CompileProbe(model)  # has anything been compiled since (asked every step)
        self._context = _StepContext(self, None, None)  # what step() returns, reused
        if not enabled:
            return
        with self._guard(Feature.SETUP):
            self._setup(model, optimizer)
        if not self._guard.ok(Feature.SETUP):  # a null tracker from here: nothing stays attached
            self._detach()
            self.enabled = False

    # -- set-up -----------------------------------------------------------------------------------

    def _setup(self, model: torch.nn.Module, optimizer: Any) -> None:
        self._counter = SavedTensorCounter()
        self._probe_ref: weakref.ref[torch.Tensor] | None = None  # one parameter, watched every step
        self._probe_ptr = 0
        self._probe_data: int | None = None
        self._model_watch = ModelWatch(model)
        self._optimizer_watch = OptimizerWatch(
            self.attach_optimizer, lambda fn: outside_compile(self._guard.wrap(Feature.OPTIMIZER, fn))
        )
        self._refresh_weights()
        self._sums.gradients = gradient_bytes(model)
        self._register_model_hooks()
        self.attach_optimizer(optimizer)

    @property
    def _optimizer(self) -> Any:
        ref = self._optimizer_ref
        return ref() if ref is not None else None

    def _register_model_hooks(self) -> None:
        """The forward pre/post hooks, kept out of compiled graphs once anything is compiled."""
        for h in self._handles:
            h.remove()
        self._compile_safe = compile_in_use(self.model)
        model = self.model
        pre, post = self._out_of_compile(self._on_forward_pre), self._out_of_compile(self._on_forward_post)
        self._handles = [
            model.register_forward_pre_hook(pre, with_kwargs=True),
            model.register_forward_hook(post, always_call=True),
        ]

    def _optimizers(self) -> list[Any]:
        opts = [self._optimizer] + [ref() for ref in self._extra_optimizers]
        return [opt for opt in opts if opt is not None]

    def _register_optimizer_hooks(self) -> None:
        for h in self._opt_handles:
            h.remove()
        self._opt_handles = []
        pre, post = (
            self._out_of_compile(self._on_optimizer_pre),
            self._out_of_compile(self._on_optimizer_post),
        )
        zero = self._zero
        for i, each in enumerate(self._optimizers()):
            if i == 0 and zero is not None:  # its torch optimizer steps once per group: hook the update
                self._opt_handles += list(zero_opt.hook_step(zero, pre, post))
            elif hasattr(each, "register_step_pre_hook") and hasattr(each, "register_step_post_hook"):
                self._opt_handles += [each.register_step_pre_hook(pre), each.register_step_post_hook(post)]

    def _sum_optimizer_states(self) -> int:
        """Every tracked optimizer's states; under DeepSpeed ZeRO the first one's fp32 master partitions too.
        On CUDA also the paged states that live in managed memory (their own figure, not states)."""
        opts = self._optimizers()
        if self._is_cuda:
            self._managed = sum(paged_state_bytes(opt) for opt in opts)
        zero = self._zero
        return sum(
            zero_opt.state_bytes(opt, zero) if i == 0 and zero is not None else optimizer_state_bytes(opt)
            for i, opt in enumerate(opts)
        )

    def _out_of_compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return outside_compile(fn) if self._compile_safe else fn

    def _keep_out_of_compile(self) -> None:
        """Something was compiled since the hooks were registered (the wrapper costs ~0.5 µs a call, so
        it is not there before): wrap them now, at a step boundary, before a compiled frame traces them."""
        if self._compile_safe or not self._compiled():
            return
        with self._guard(Feature.SETUP):
            self._register_model_hooks()
            if self._optimizer is not None:
                self._register_optimizer_hooks()

    def attach_optimizer(self, optimizer: Any) -> None:
        """Track this optimizer's steps (the Trainer creates its optimizer after the model)."""
        if not self.enabled or optimizer is None:
            return
        with self._guard(Feature.OPTIMIZER):
            opt = unwrap_optimizer(optimizer)
            if opt is self._optimizer:
                return
            zero = zero_opt.find_zero(optimizer, self.model)
            self._zero_ref = weakref.ref(zero) if zero is not None else None
            self._sums.buckets = self._zero_buckets() or self._sums.buckets
            self._optimizer_ref = self._optimizer_watch.current = weakref.ref(opt)
            self._extra_optimizers = [ref for ref in self._extra_optimizers if ref() not in (None, opt)]
            self._optimizer_watch.extra = weakref.WeakSet(self._optimizers()[1:])
            self._register_optimizer_hooks()
            self._hello_changed()
            # a new optimizer makes its states on its first step: re-sum them there, whatever the schedule
            self._forced_refresh = self._step.index if self._step is not None else self._steps_done
        opt = self._optimizer
        if opt is not None and self._guard.ok(Feature.OPTIMIZER_STATES):
            with self._guard(Feature.OPTIMIZER_STATES):
                self._sums.optimizer_states = self._sum_optimizer_states()

    def add_model(self, name: str, module: torch.nn.Module) -> None:
        """Name another model the step runs (a distillation teacher, a reference model, an EMA copy): its
        weights are the ``other_models`` component, not runtime or unattributed. Re-summed from the next
        step on; the trained model itself is ignored."""
        if not self.enabled or not isinstance(module, torch.nn.Module) or module is self.model:
            return
        with self._guard(Feature.DEVICE):
            if self._others.add(name, module):
                self._hello_changed()
                self._forced_refresh = self._step.index if self._step is not None else self._steps_done

    def add_optimizer(self, optimizer: Any) -> None:
        """Track a further optimizer stepped in the same training steps (a GAN's second one): its
        updates end steps like the first one's, and its states are summed with the first one's."""
        if not self.enabled or optimizer is None:
            return
        if self._optimizer is None:
            self.attach_optimizer(optimizer)
            return
        with self._guard(Feature.OPTIMIZER):
            opt = unwrap_optimizer(optimizer)
            if any(opt is each for each in self._optimizers()):
                return
            self._extra_optimizers.append(weakref.ref(opt))
            self._optimizer_watch.extra = weakref.WeakSet(self._optimizers()[1:])
            self._register_optimizer_hooks()
            self._forced_refresh = self._step.index if self._step is not None else self._steps_done

    def set_precision(self, precision: Precision | None = None, *, grad_scaler: bool | None = None) -> None:
        """Tell the tracker what it cannot see (e.g. the Trainer's fp16/bf16 flags)."""
        if precision is not None:
            self._precision_override = precision
        if grad_scaler is not None:
            self._grad_scaler = grad_scaler
        self._hello_changed()

    def _hello_changed(self) -> None:
        """Rebuilt on next use; a running publisher gets it with the next snapshot."""
        self._hello = None
        self._hello_stale = True

    @property
    def _zero(self) -> Any:
        ref = self._zero_ref
        return ref() if ref is not None else None

    def _gradient_bytes(self) -> int:
        """Gradients held now: ``param.grad``, and under DeepSpeed ZeRO its own gradient buffers."""
        zero = self._zero
        if zero is None:
            return gradient_bytes(self.model)
        return zero_opt.gradient_bytes(list(self.model.parameters()), zero)

    def _zero_buckets(self) -> Buckets | None:
        zero = self._zero
        return zero_opt.buckets(zero) if zero is not None else None

    def _refreshes(self, rec: StepRecord) -> bool:
        """Are the sums re-taken on this step? The schedule's answer, taken as the step began, or a change
        seen since (a new optimizer, another model)."""
        return rec.refresh or rec.index == self._forced_refresh

    def _refresh_weights(self) -> None:
        """Re-sum the weights and re-learn the parameters (storages, device, count, dtype)."""
        model = self.model
        by_dtype = weight_bytes(model)
        self._sums.weights_by_dtype = by_dtype
        self._sums.weights = sum(by_dtype.values())
        params = list(model.parameters())
        weights = [*params, *model.buffers()]
        self._counter.set_params(weights)
        if self._guard.ok(Feature.CHANGES):
            with self._guard(Feature.CHANGES):
                self._model_watch.remember(model)
                self._optimizer_watch.set_params(model)
        candidates = [p for p in params if p.requires_grad] or params
        probe = candidates[0] if candidates else None
        self._probe_ref = weakref.ref(probe) if probe is not None else None
        self._probe_ptr = storage_key(probe) if probe is not None else 0
        # A plain parameter's own data pointer moves with its storage, and reading it allocates nothing.
        plain = probe is not None and type(probe) in (torch.nn.Parameter, torch.Tensor)
        self._probe_data = probe.data_ptr() if plain and probe is not None else None
        count, dtype = parameter_count(model), dominant_dtype(model)
        trainable = parameter_count(model, trainable=True)
        quantization = weight_quantization(params)
        if (count, dtype, trainable, quantization) != (
            self._param_count,
            self._param_dtype,
            self._trainable_count,
            self._quantization,
        ):
            self._param_count, self._param_dtype = count, dtype
            self._trainable_count, self._quantization = trainable, quantization
            self._hello_changed()
        device = probe.device if probe is not None else torch.device("cpu")
        if device != self._device:
            self._use_device(device)
        if self._others:
            others = self._refresh_others(weights)
            # another model's weights are weights too: never activations when the step's forward saves them
            self._counter.set_params([*weights, *others])

    def _refresh_others(self, weights: list[torch.Tensor]) -> list[torch.Tensor]:
        """Re-sum the other models' weights (those on the trained model's device, storages of the trained
        model excluded); returns their tensors."""
        if not self._guard.ok(Feature.DEVICE):
            return []
        with self._guard(Feature.DEVICE):
            own = {storage_key(t) for t in weights}
            by_name = self._others.bytes_by_name(own, self._device)
            if by_name != self._sums.other_by_name:
                self._hello_changed()  # the hello names each model with its bytes
            self._sums.other_by_name = by_name
            self._sums.other_models = sum(by_name.values())
            return self._others.tensors()
        return []

    def _model_changed(self, index: int, quiet: bool = False) -> bool:
        """The model's parameters changed since the last look (cheap: see anatomy.hook.changes)."""
        if Feature.CHANGES in self._guard.off:
            return False
        try:  # (a parameter without storage cannot be compared)
            ref = self._probe_ref
            if ref is not None:
                probe = ref()
                if probe is None:
                    return True  # the parameter is gone
                data = self._probe_data
                if data is not None and probe.data_ptr() != data:
                    return True  # moved (.to(), a new device)
                if data is None and storage_key(probe) != self._probe_ptr:
                    return True
            watch = self._model_watch
            if quiet or not self._schedule.look_due(index, self._looked_at):
                return watch.suspect and watch.changed(self.model, look=False)
            self._looked_at = index
            began = time.perf_counter()
            changed = watch.changed(self.model, look=True)
            self._schedule.budget.charge(LOOK, time.perf_counter() - began)
            return changed
        except Exception as exc:
            self._guard.fail(Feature.CHANGES, exc)
        return False

    def _use_device(self, device: torch.device) -> None:
        """Measure on this device: the caching allocator's statistics on CUDA, else glibc's heap."""
        self._device = device
        self._counter.device = device  # a saved tensor offloaded elsewhere holds none of its memory
        self._cuda_events = device.type == "cuda"
        self._hello_changed()
        # A fresh backend: a trace of another device's memory says nothing about this one.
        if device.type == "cuda":
            self._memory = CudaBackend(CudaAllocator(device), self._guard)
            return
        if self._heap is None:
            self._heap = HostHeap()
        self._memory = HeapBackend(self._heap, self._guard)

    def _detach(self) -> None:
        for h in self._handles + self._opt_handles:
            h.remove()
        self._handles, self._opt_handles = [], []
        for watch in (getattr(self, "_model_watch", None), getattr(self, "_optimizer_watch", None)):
            if watch is not None:
                watch.close()

    @property
    def _is_cuda(self) -> bool:
        return self._memory is not None and self._memory.is_cuda

    @property
    def sample_every(self) -> int:
        return self._schedule.sample_every

    @property
    def default_samples(self) -> int | None:
        return self._throughput.default_samples

    @property
    def default_tokens(self) -> int | None:
        return self._throughput.default_tokens

    @property
    def error(self) -> str | None:
        return self._guard.error

    # -- step boundaries --------------------------------------------------------------------------

    def step(self, samples: int | None = None, tokens: int | None = None) -> _StepContext | _NullContext:
        """Context manager around one optimizer step (all its micro-batches)."""
        if not self.enabled or self._closed:
            return _NullContext(self)
        ctx = self._context  # one, reused: its values are read as it is entered
        if ctx._entered:  # (a step inside a step: its own)
            return _StepContext(self, samples, tokens)
        ctx._samples, ctx._tokens = samples, tokens
        return ctx

    def begin_step(self, samples: int | None = None, tokens: int | None = None) -> None:
        """A step block begins. Blocks in which no optimizer updates (gradient accumulation, a skipped
        fp16 step, accelerate's non-sync micro-batches) are micro-batches of the next step that does."""
        if not self.enabled or self._closed:
            return
        self._explicit = True
        rec = self._step
        if rec is not None and not rec.suspended:
            self.end_step()  # (a block never ended)
            rec = self._step
        if rec is not None and rec.suspended and not rec.updated:
            with self._guard(Feature.STEP):
                rec.suspended = False
                rec.blocks += 1
                rec.samples = _plus(rec.samples, samples)
                rec.tokens = _plus(rec.tokens, tokens)
            return
        if rec is not None:  # suspended, and an optimizer stepped after its block (outside any block)
            self._finish_step(rec, None)
        if not self._compile_safe and self._compiled():
            self._keep_out_of_compile()
        self._begin(auto=False, samples=samples, tokens=tokens)

    def _begin(self, auto: bool, samples: int | None = None, tokens: int | None = None) -> None:
        # The per-step path: a section per hook (try/except, the guard's contract), no call it can spare.
        off = self._guard.off
        try:
            index = self._steps_done
            sched = self._schedule
            # One compare says whether anything can be due by the step count (an ordinary step: none of
            # the schedule's checks); a change the hooks saw, or a re-sum forced, is not ordinary.
            quiet = index < self._quiet_until and index != self._forced_refresh
            quiet = quiet and not self._model_watch.suspect
            if self._model_changed(index, quiet):  # a new head, an untied embedding, .to(): all sums anew
                self._forced_refresh = index
                quiet = False
            clock = StepClock(cuda=self._cuda_events and Feature.TIMING not in off)
            rec = StepRecord(index, auto, samples, tokens, clock)
            self._step = rec
            sums = self._sums
            rec.opt_begin = sums.optimizer_states
            ref = self._probe_ref
            probe = ref() if ref is not None else None
            rec.grads_begin = sums.gradients if probe is not None and probe.grad is not None else 0
            if self._zero_ref is not None:  # DeepSpeed's buffers, not param.grad: as last measured at a start
                rec.grads_begin = self._zero_grads_begin
            rec.quiet = quiet
            rec.refresh = not quiet and (sched.refresh_due(index) or index == self._forced_refresh)
            if rec.refresh:
                began = time.perf_counter()
                self._refresh_weights()
                rec.grads_begin = sums.gradients = self._gradient_bytes()
                self._zero_grads_begin = rec.grads_begin
                sched.budget.charge(REFRESH, time.perf_counter() - began)
            rec.heap_on = not quiet and sched.heap_due(index)
            memory = self._memory
            if rec.heap_on and memory is not None:  # (a step that does not read the heap reads nothing)
                memory.read_start(rec)
            if Feature.TIMING not in off:
                clock.mark(BEGIN)
            if not quiet and sched.sample_due(index):
                rec.began_s = time.perf_counter()
                if self._guard.ok(Feature.OP_GROUPS):
                    self._start_profiler(rec)
                traced = self._memory is not None and self._memory.traced is not None
                if sched.trace_due(index, traced):
                    self._start_trace(rec)
        except Exception as exc:
            self._guard.fail(Feature.STEP, exc)

    def end_step(self, exc: BaseException | None = None) -> None:
        """Close the current step. With ``exc`` (the exception that ended it), an out-of-memory
        error writes the last snapshot with the error text to the OOM file."""
        rec = self._step
        if not self.enabled or rec is None or rec.suspended:
            if exc is not None and self.enabled and is_oom(exc):
                self._write_oom(exc)
            return
        if exc is None and not rec.updated and self._defers(rec):
            self._suspend(rec)
            return
        self._finish_step(rec, exc)
        if exc is not None and is_oom(exc):
            self._write_oom(exc)

    def _finish_step(self, rec: StepRecord, exc: BaseException | None) -> None:
        self._step = None
        if rec.window or self._counter.active:
            self._close_window(rec)
        try:
            self._finish(rec, exc)
        except Exception as error:
            self._guard.fail(Feature.STEP, error)

    def _defers(self, rec: StepRecord) -> bool:
        """Does a block that did not update continue into the next one? Only where an update can be
        seen (a tracked optimizer with step hooks), and not forever (a loop that never steps it)."""
        return bool(self._opt_handles) and rec.blocks < MAX_MERGED_BLOCKS

    def _suspend(self, rec: StepRecord) -> None:
        """The block ended without an optimizer update: the step goes on in the next block (what runs
        between blocks, data loading, is the step's "other" time)."""
        self._close_window(rec)
        with self._guard(Feature.STEP):
            rec.suspended = True
            if rec.in_forward:  # a forward left open (a framework's forward mark without a backward)
                rec.in_forward = 0
            if self._guard.ok(Feature.TIMING):
                rec.clock.mark(BACKWARD_END)

    def _discard(self, rec: StepRecord) -> None:
        """Trailing micro-batches that no update followed (the run ended): not a step."""
        self._step = None
        self._close_window(rec)
        with self._guard(Feature.STEP):
            if rec.trace is not None:
                self._stop_trace(rec)
            if rec.profiler is not None:
                self._stop_profiler(rec, _DISCARDED)

    def _finish(self, rec: StepRecord, exc: BaseException | None) -> None:
        if rec.trace is not None:  # entered after the profiler: leaves first
            self._stop_trace(rec)
        if rec.profiler is not None:
            self._stop_profiler(rec, exc)
        off = self._guard.off
        if Feature.TIMING not in off:
            rec.clock.mark(END)
        memory = self._memory
        if memory is not None and not rec.optimizer_ran and rec.heap_on:
            # otherwise the optimizer's readings already cover the step's end
            memory.read(
                rec, Phase.OTHER, explained_after_optimizer(rec), held_after_optimizer(rec, self._sums)
            )
        due = exc is not None or self._steps_done == 0
        due = due or time.monotonic() - self._last_built >= self.interval_s
        if memory is not None:
            heap_step = memory.step_ends(rec, stats_due=due)
            if heap_step is not None:
                self._schedule.heap_step = heap_step
            if memory.runtime is None and rec.heap_from is None and isinstance(memory, HeapBackend):
                comm = communication_bytes(self._sums.buckets, rec.grads_begin) or 0
                # other models built before the first step are named, not runtime
                memory.measure_runtime(rec, step_parts(rec, self._sums), comm + self._sums.other_models)
        if (rec.refresh or rec.index == self._forced_refresh) and Feature.GRADIENTS not in off:
            with self._guard(Feature.GRADIENTS):  # DDP's buckets, rebuilt after the first backward
                self._sums.buckets = ddp_buckets(self.model) or self._zero_buckets()
            if rec.grads is None and Feature.GRADIENTS not in off:
                # No optimizer hook saw this step: gradients as they are now.
                with self._guard(Feature.GRADIENTS):
                    rec.grads = self._gradient_bytes()
                    self._sums.gradients = rec.grads
        self._steps_done += 1
        # (a step begun by begin_step: the next begin_step looks, before the next forward)
        if rec.auto and not self._compile_safe and self._compiled():
            self._keep_out_of_compile()
        if rec.heap_on or rec.began_s:
            self._charge(rec, memory)
        throughput = self._throughput
        throughput.step_finished(rec)
        groups_step = throughput.op_groups_step
        throughput.resolve()
        self._finished = rec
        if self._steps_done >= self._quiet_until:  # (the steps per interval: as of this step's time)
            self._quiet_until = self._schedule.quiet_until(self._steps_done, self._looked_at)
        if due or exc is not None or groups_step != throughput.op_groups_step or not self._repeat(rec):
            self._build(rec)
        if exc is None:  # every finished step goes to the publisher (latest-only, O(1))
            self._publish_latest()
        else:
            self._unpublished = True

    def _charge(self, rec: StepRecord, memory: MemoryBackend | None) -> None:
        """What this step's optional work cost, to the schedule's budget."""
        budget = self._schedule.budget
        if memory is not None and rec.heap_on:
            budget.charge(HEAP, memory.take_spent())
        if rec.began_s:  # a sampled step: the profiler and the trace cost what the step took beyond the usual
            took = time.perf_counter() - rec.began_s
            budget.charge(SAMPLED, max(took - self._schedule.median_step_s, 0.0))

    def _repeat(self, rec: StepRecord) -> bool:
        """An ordinary step's snapshot, O(1): the last one built with this step's number, time and timing.
        Only where every other figure would come out the same — nothing was measured on this step (no
        count, no re-sum, no heap read, no trace), the same micro-batches and batch size, no new error,
        and on CUDA the same peak from the same start. Otherwise (False) the full build."""
        last = self._latest
        if last is None or rec.profiled or rec.activations is not None:
            return False
        if rec.refresh or rec.index == self._forced_refresh or self._guard.version != self._built_errors:
            return False
        if stamp(rec, self._sums, batch_size(rec, self._throughput.default_samples)) != self._built_stamp:
            return False
        memory = self._memory
        if memory is not None and not memory.is_cuda and (rec.heap_on or rec.heap_from is None):
            return False
        if isinstance(memory, CudaBackend):
            start = rec.cuda_start
            if start is None or not rec.cuda_peaks or memory.step_peak(rec, start) != memory.last_peak:
                return False
        try:
            throughput = self._throughput
            throughput.update_timing()
            self._seq += 1
            snap = repeat(last, self._seq, time.time(), rec.index, throughput.timing)
            self._latest = snap
            self.history.append(snap)
            return True
        except Exception as exc:
            self._guard.fail(Feature.SNAPSHOT, exc)
        return False

    # -- sampled steps ----------------------------------------------------------------------------

    def _start_profiler(self, rec: StepRecord) -> None:
        with self._guard(Feature.OP_GROUPS):
            # Normalization modules are watched by module hooks, except where something is compiled:
            # a graph compiled while they are on would break at every norm for good.
            modules = () if compile_in_use(self.model) else self.model.modules()
            prof = OpGroupProfiler(modules, hook=outside_compile)
            prof.__enter__()
            rec.profiler = prof
            rec.profiled = True

    def _stop_profiler(self, rec: StepRecord, exc: BaseException | None) -> None:
        prof, rec.profiler = rec.profiler, None
        if prof is None:
            return
        with self._guard(Feature.OP_GROUPS):
            if exc is None:
                prof.__exit__(None, None, None)
                self._throughput.profile_finished(rec.index, prof)
            else:
                prof.__exit__(type(exc), exc, exc.__traceback__)

    def _probe_held(self) -> Held:
        rec = self._step
        watch = rec.grad_watch if rec is not None else None
        counter = self._counter
        return Held(counter.alive_activation_bytes, counter.alive_copy_bytes, watch.bytes if watch else 0)

    def _start_trace(self, rec: StepRecord) -> None:
        """The per-op memory trace: the glibc heap (CPU) or the allocator's allocated bytes (CUDA, a
        host-side counter: no synchronization), read after every op."""
        read = self._memory.trace_reader() if self._memory is not None else None
        if read is None or not self._guard.ok(Feature.HEAP_TRACE):
            return
        try:
            with self._guard(Feature.HEAP_TRACE):
                rec.grad_watch = GradientWatcher(self.model.parameters())
                self._counter.track_alive = True
                trace = MemoryTrace(read=read, probe=self._probe_held)
                trace.__enter__()
                rec.trace = trace
                rec.counting = True  # the trace needs this step's saved tensors
                self._schedule.retrace = False
                rec.profiled = True
        finally:
            if rec.trace is None:
                self._end_watch(rec)

    def _end_watch(self, rec: StepRecord) -> None:
        self._counter.track_alive = False
        watch, rec.grad_watch = rec.grad_watch, None
        if watch is not None:
            with self._guard(Feature.HEAP_TRACE):
                watch.close()

    def _stop_trace(self, rec: StepRecord) -> None:
        trace, rec.trace = rec.trace, None
        self._end_watch(rec)
        memory = self._memory
        if trace is None or memory is None:
            return
        with self._guard(Feature.HEAP_TRACE):
            trace.__exit__(None, None, None)
            start = memory.trace_start(rec)
            if start is not None:
                parts = step_parts(rec, self._sums)
                traced = traced_split(rec, trace, start, parts, self._sums.optimizer_states)
                if traced is not None:
                    memory.traced = traced

    # -- hooks ------------------------------------------------------------------------------------

    def _on_forward_pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        count = reached = False
        off = self._guard.off
        rec = None
        try:
            rec = self._step
            if rec is None:
                if self._explicit or self._closed or not (torch.is_grad_enabled() and module.training):
                    return
                self._begin(auto=True)
                rec = self._step
                if rec is None:
                    return
            if not torch.is_grad_enabled() or rec.suspended:  # (between step blocks: not the step's)
                return
            rec.in_forward += 1
            if rec.in_forward > 1:
                return  # re-entrant call of the same model inside its forward
            if not rec.recall:
                rec.micro += 1
            if rec.window or self._counter.active:
                self._close_window(rec)  # an earlier micro-batch's, left open after its forward
            x = _first_tensor(args, kwargs)
            shape = tuple(x.shape) if x is not None else None
            if shape is not None and self._batch_shape is None:
                self._batch_shape = shape  # once: a shape that varies per step must not resend the hello
                self._hello_changed()
            if x is not None and x.dim() >= 1 and (rec.samples is None or rec.tokens is None):
                rec.samples_seen += int(x.shape[0])
                if x.dim() >= 2 and not x.is_floating_point():
                    rec.tokens_seen += int(x.numel())
            if Feature.ACTIVATIONS not in off:
                sched = self._schedule
                if not rec.quiet or rec.counting or shape != sched.input_shape:
                    rec.counting = sched.count_due(rec.index, shape, rec.counting)
                count = rec.counting or rec.trace is not None
            if count or rec.heap_on:  # autocast is looked for on the steps that measure (~10 µs cold)
                ac = active_autocast_dtype(self._device.type if self._device is not None else "cpu")
                if ac is not None and ac != self._autocast_dtype:
                    self._autocast_dtype = ac
                    self._hello_changed()  # the precision is mixed now
            memory = self._memory
            if not rec.heap_on and rec.micro == 1 and (count or shape != self._schedule.input_shape):
                # A new shape (or a count due): read this step's heap after all, from here (nothing
                # of the step has been allocated yet).
                rec.heap_on = True
                if memory is not None:
                    memory.read_start(rec)
            if rec.trace is not None or (memory is not None and memory.is_cuda):
                self._boundary(rec, Phase.FORWARD)
            if Feature.TIMING not in off:
                rec.clock.mark(FORWARD_PRE)
            reached = True
        except Exception as exc:
            self._guard.fail(Feature.FORWARD, exc)
        if count and reached and rec is not None:
            # (fails where saved-tensor hooks are disabled, e.g. by a compiler or FSDP)
            with self._guard(Feature.ACTIVATIONS):
                counter = self._counter
                counter.reset()
                counter.set_inputs(input_storage_keys(args, kwargs))
                rec.window = counter.start(keep_open=True)

    def _on_forward_post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        try:
            rec = self._step
            if rec is None or rec.in_forward == 0:
                return
            rec.in_forward -= 1
            if rec.in_forward > 0:
                return
            counter = self._counter
            sums = self._sums
            if rec.window:  # what the forward saved (the window may stay open for the loss)
                with self._guard(Feature.ACTIVATIONS):
                    counter.observe_reentrant_states(output)  # what reentrant checkpoints keep on their nodes
                acts = counter.activation_bytes
                copies = counter.weight_copy_bytes
                with self._guard(Feature.ACTIVATIONS):
                    self._record_unsharded(rec)
                    counter.end_forward()
                if not counter.active:
                    self._record_count(rec)
            else:  # not counted this time: the last count stands
                acts, copies = sums.activations or 0, sums.weight_copies
            if Feature.TIMING not in self._guard.off:
                rec.clock.mark(FORWARD_POST)
            memory = self._memory
            if memory is None:
                return
            if rec.heap_on:  # (only a step that reads the heap reads at a boundary)
                earlier_grads = max(sums.gradients - rec.grads_begin, 0) if rec.micro > 1 else 0
                held = Held(acts, copies, rec.grads_begin + earlier_grads, rec.opt_begin)
                memory.read(rec, Phase.FORWARD, acts + copies + earlier_grads, held)
            if rec.trace is not None or memory.is_cuda:
                self._boundary(rec, Phase.BACKWARD)
        except Exception as exc:
            self._guard.fail(Feature.FORWARD, exc)

    def forward_begin(self, batch: Any = None) -> None:
        """A framework's training forward starts — Lightning's ``training_step``, which may call any of
        the model's submodules (``self.model(...)``) rather than the model's own forward. The model's
        forward hooks inside it nest and are not counted twice. ``batch``: its first tensor gives the
        micro-batch's size."""
        if not self.enabled or self._step is None:
            return
        args = (batch,) if isinstance(batch, torch.Tensor) else ()
        self._on_forward_pre(self.model, args, {})

    def forward_end(self) -> None:
        """The framework's forward is done (its loss exists; Lightning's ``on_before_backward``)."""
        rec = self._step
        if not self.enabled or rec is None or rec.in_forward != 1:
            return
        self._on_forward_post(self.model, (), None)

    def _record_count(self, rec: StepRecord) -> None:
        """The micro-batch's window closed: keep the largest micro-batch's counts."""
        rec.window = False
        counter, sums = self._counter, self._sums
        acts = counter.activation_bytes
        rec.activations = acts if rec.activations is None else max(rec.activations, acts)
        rec.weight_copies = max(rec.weight_copies, counter.weight_copy_bytes)
        rec.inputs = max(rec.inputs, counter.input_bytes)
        sums.activations, sums.weight_copies, sums.inputs = rec.activations, rec.weight_copies, rec.inputs
        self._schedule.counted_step = rec.index
        self._schedule.budget.charge(COUNT, counter.spent_s)
        counter.spent_s = 0.0
        if counter.weight_copy_dtype is not None and counter.weight_copy_dtype != self._autocast_dtype:
            self._autocast_dtype = counter.weight_copy_dtype
            self._hello_changed()

    def _record_unsharded(self, rec: StepRecord) -> None:
        """FSDP's gathered parameters still held as the forward returns (the root's, or every layer's
        without reshard_after_forward): what stays allocated into backward. Read here, not when the window
        closes — that may be after backward, once FSDP has resharded everything."""
        counter = self._counter
        if not counter.unsharded_seen:
            return
        held = counter.unsharded_held_bytes(self.model.parameters())
        rec.unsharded = held if rec.unsharded is None else max(rec.unsharded, held)
        self._sums.unsharded = rec.unsharded

    def _close_window(self, rec: StepRecord) -> None:
        """Close the counting window at the step's next boundary (a backward's end, the optimizer, the
        next micro-batch, the step's end): what the loss saved after the model's forward is in it."""
        counter = self._counter
        if not rec.window and not counter.active:
            return
        with self._guard(Feature.ACTIVATIONS):
            counter.stop()
        if rec.window:
            self._record_count(rec)

    def _on_optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None:
        """An optimizer step begins. With a closure (LBFGS, Lightning), forward and backward run inside
        the step: the optimizer phase begins when the closure returns, so the closure is wrapped — the
        wrapper calls the user's closure once per call, returns what it returns and lets its exceptions
        through unchanged."""
        wrapped = None
        if kwargs or len(args) > 1:  # (a plain ``step()`` gets only the optimizer: nothing to look at)
            with self._guard(Feature.OPTIMIZER):
                wrapped = _wrap_closure(self, args, kwargs)
        if wrapped is None:
            self.optimizer_begin()
        return wrapped

    def _on_optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        rec = self._step
        if rec is None and not self._explicit and not self._closed:
            self._unseen_updates += 1
            if self._unseen_updates == UNSEEN_UPDATES_WARNING:
                log.warning(
                    "anatomy: %d optimizer updates and no training-mode forward of the tracked %s: nothing "
                    "is measured. Track the module whose forward the loop calls, mark steps with "
                    "tracker.step(), or with PyTorch Lightning use anatomy.lightning.AnatomyCallback.",
                    self._unseen_updates,
                    type(self.model).__name__,
                )
        if rec is not None:
            rec.updated = True  # the hook fires only when the step ran (not on a skipped fp16 step)
            rec.recall = False
        self.optimizer_end()

    def closure_begin(self) -> None:
        """A closure passed to the optimizer's step starts (its forward). Called again inside the same
        optimizer step (LBFGS re-evaluates), the optimizer phase pauses for it."""
        rec = self._step
        if not self.enabled or rec is None or not rec.in_optimizer:
            return
        with self._guard(Feature.OPTIMIZER):
            rec.in_optimizer = False
            rec.recall = True

    def closure_end(self) -> None:
        """The closure returned: this step's gradients are complete, the optimizer's math begins."""
        self.optimizer_begin()

    def backward_end(self) -> None:
        """A micro-batch's backward is done (the Trainer's ``on_substep_end``): its gradients exist."""
        rec = self._step
        if not self.enabled or rec is None or rec.in_forward or rec.suspended:
            return
        if rec.window or self._counter.active:
            self._close_window(rec)
        try:
            if Feature.TIMING not in self._guard.off:
                rec.clock.mark(BACKWARD_END)
            memory = self._memory
            if memory is not None and rec.heap_on:
                grads = self._sums.gradients
                held = Held(gradients=max(grads, rec.grads_begin), optimizer_states=rec.opt_begin)
                memory.read(rec, Phase.BACKWARD, max(grads - rec.grads_begin, 0), held)
        except Exception as exc:
            self._guard.fail(Feature.BACKWARD, exc)

    def optimizer_begin(self) -> None:
        """Gradients are complete: measure them, and start the optimizer phase. Called by the
        optimizer's step pre-hook; the Trainer callback calls it too (a second call is ignored)."""
        rec = self._step
        if not self.enabled or rec is None or rec.in_optimizer or rec.in_forward:
            return
        if rec.optimizer_ran:  # a second optimizer (a GAN's), or a closure's re-evaluation done
            rec.in_optimizer = True
            if self._guard.ok(Feature.TIMING):
                rec.clock.mark(OPTIMIZER_PRE)
            # Under ZeRO this is the Trainer's on_pre_optimizer_step after the engine's update (inside its
            # backward): DeepSpeed's buffers are empty now and param.grad never set — the gradients measured
            # as its step began stand (re-summing here left 0 as the figure of later, unmeasured steps).
            refresh = rec.grads is not None and self._zero_ref is None and self._refreshes(rec)
            if refresh and self._guard.ok(Feature.GRADIENTS):
                with self._guard(Feature.GRADIENTS):  # gradients at their largest over the step's updates
                    # (ZeRO's own buffers too: param.grad alone would make the standing figure 0 there)
                    rec.grads = self._sums.gradients = max(rec.grads or 0, self._gradient_bytes())
            return
        if rec.window or self._counter.active:
            self._close_window(rec)
        off = self._guard.off
        try:
            rec.optimizer_ran = rec.in_optimizer = True
            sums = self._sums
            if rec.grads is None and Feature.GRADIENTS not in off and self._refreshes(rec):
                with self._guard(Feature.GRADIENTS):
                    sums.gradients = self._gradient_bytes()
            rec.grads = sums.gradients
            memory = self._memory
            if memory is not None:
                if rec.heap_on:
                    held = Held(gradients=rec.grads, optimizer_states=rec.opt_begin)
                    memory.read(rec, Phase.BACKWARD, max(rec.grads - rec.grads_begin, 0), held)
                if rec.trace is not None or memory.is_cuda:
                    self._boundary(rec, Phase.OPTIMIZER)
            if Feature.TIMING not in off:
                rec.clock.mark(OPTIMIZER_PRE)
            if rec.profiler is not None:
                rec.profiler.set_phase(Phase.OPTIMIZER)
        except Exception as exc:
            self._guard.fail(Feature.OPTIMIZER, exc)

    def optimizer_end(self) -> None:
        """The optimizer step is done: its states exist now. Ends an automatic step."""
        rec = self._step
        if not self.enabled or rec is None or not rec.in_optimizer:
            return
        rec.in_optimizer = False
        if rec.opt_after is not None:  # a second optimizer's step: its time, and its states on refresh
            if self._guard.ok(Feature.TIMING):
                rec.clock.mark(OPTIMIZER_POST)
            if self._refreshes(rec) and self._guard.ok(Feature.OPTIMIZER_STATES):
                with self._guard(Feature.OPTIMIZER_STATES):
                    rec.opt_after = self._sums.optimizer_states = self._sum_optimizer_states()
            return
        off = self._guard.off
        try:
            if Feature.TIMING not in off:
                rec.clock.mark(OPTIMIZER_POST)
            refresh = rec.refresh or rec.index == self._forced_refresh
            if refresh and Feature.OPTIMIZER_STATES not in off and self._optimizer is not None:
                with self._guard(Feature.OPTIMIZER_STATES):
                    self._sums.optimizer_states = self._sum_optimizer_states()
            rec.opt_after = self._sums.optimizer_states
            memory = self._memory
            if refresh and memory is not None:  # in steady state the heap after the step equals before
                held = held_after_optimizer(rec, self._sums)
                memory.read(rec, Phase.OPTIMIZER, explained_after_optimizer(rec), held)
            if rec.trace is not None or (memory is not None and memory.is_cuda):
                self._boundary(rec, Phase.OTHER)
        except Exception as exc:
            self._guard.fail(Feature.OPTIMIZER, exc)
        if rec.auto and rec.updated:
            self.end_step()

    def _boundary(self, rec: StepRecord, next_phase: Phase) -> None:
        """A phase ends and ``next_phase`` begins: tell the sampled step's trace, and close the
        allocator's peak window (CUDA)."""
        if rec.trace is not None:
            rec.trace.phase = next_phase
        if self._memory is not None:
            self._memory.phase_ends(rec, next_phase)

    # -- the finished step's figures --------------------------------------------------------------

    def _memory_result(self, rec: StepRecord) -> MemoryResult:
        """The finished step's memory figures: its named tensors, the backend's peak of it, and what the
        tracker knows, assembled by :func:`anatomy.hook.assembly.memory_result`."""
        sums = self._sums
        parts = step_parts(rec, sums)
        backend = self._memory
        split = backend.peak(rec, parts) if backend is not None else None
        facts = StepFacts(
            off=frozenset(self._guard.off),
            has_optimizer=self._optimizer is not None,
            counted_step=self._schedule.counted_step,
            has_others=bool(self._others),
            managed=self._managed,
            batch=batch_size(rec, self._throughput.default_samples),
            runtime=backend.runtime if backend is not None else None,
            source=backend.source if backend is not None else MemorySource.NONE,
        )
        result = memory_result(rec, parts, sums, split, facts)
        if result.excess and not self._balance_logged:
            self._balance_logged = True
            log.info(
                "anatomy: the named tensors exceed the step's peak by %d bytes; taken off unattributed",
                result.excess,
            )
        return result

    # -- set-up as detected -----------------------------------------------------------------------

    @property
    def precision(self) -> Precision:
        detected = self._precision_override
        if detected is None:
            detected = detect_precision(
                param_dtype=self._param_dtype,
                autocast_dtype=self._autocast_dtype,
                grad_scaler=self._grad_scaler,
            )
        # DeepSpeed's bit16 parameters come with fp32 masters (the Trainer's bf16 flag says "bf16" too)
        return detected if self._zero_ref is None else zero_opt.precision(self._param_dtype, detected)

    @property
    def optimizer_kind(self) -> OptimizerKind:
        ref = self._optimizer_ref  # the cache holds the weak reference, never the optimizer
        cached = self._kind_of
        if cached is None or cached[0] is not ref:
            cached = self._kind_of = (ref, detect_optimizer(self._optimizer))
        return cached[1]

    @property
    def hello(self) -> Hello:
        if self._hello is None:
            self._hello = build_hello(
                self.model,
                self._optimizer,
                device=self._device if self.enabled else None,
                is_cuda=self.enabled and self._is_cuda,
                precision=self.precision,
                started_at=self._started_at,
                guard=self._guard,
                trainable=self._trainable_count if self.enabled else None,
                quantization=self._quantization,
                others=dict(self._sums.other_by_name) if self._others else None,
                batch_shape=self._batch_shape,
            )
        return self._hello

    # -- snapshots and publishing -----------------------------------------------------------------

    @property
    def latest(self) -> Snapshot | None:
        """The snapshot of the last finished step."""
        return self._latest

    def rebuild(self) -> Snapshot | None:
        """The last finished step's snapshot built in full now, as a step that measured would be (an
        ordinary step's snapshot is the last one repeated, which this equals); it becomes the latest."""
        rec = self._finished
        return self._build(rec) if rec is not None else self._latest

    def _build(self, rec: StepRecord | None, oom: str | None = None) -> Snapshot | None:
        """The snapshot of the finished step ``rec`` (None: no step finished yet), built in full. Without
        ``oom`` it becomes the latest; with it (the error's text) it is the OOM record."""
        snap = None
        with self._guard(Feature.SNAPSHOT):
            if rec is not None:
                result = self._memory_result(rec)
            else:
                result = unmeasured(self._steps_done, self._sums.weights if self.enabled else None)
            self._throughput.update_timing()
            snap = self._snapshot(result, oom)
        if snap is None:
            return self._latest
        if oom is None:
            self._latest = snap
            self._last_built = time.monotonic()
            self._built_errors = self._guard.version
            if rec is not None:
                self._built_stamp = stamp(rec, self._sums, result.batch)
            else:
                self._built_stamp = None
            self.history.append(snap)
        return snap

    def _expected_bytes(self) -> dict[str, float | None]:
        precision, kind = self.precision, self.optimizer_kind
        total, trainable = self._param_count, self._trainable_count
        fraction = round(trainable / total, 6) if total > 0 else 1.0
        quantized = self._quantization is not None
        cached = self._expected
        if cached is None or cached[0] != (precision, kind, fraction, quantized):
            table = {
                c.value: expected_bytes_per_param(c, precision, kind, fraction, quantized)
                for c in MODEL_COMPONENTS
            }
            cached = self._expected = ((precision, kind, fraction, quantized), table)
        zero = self._zero
        if zero is not None:  # laid out as DeepSpeed lays it out (masters with the optimizer states)
            itemsize = torch.empty(0, dtype=self._param_dtype).element_size()
            return zero_opt.expected(cached[1], zero, itemsize)
        return dict(cached[1])

    def _snapshot(self, result: MemoryResult, oom: str | None) -> Snapshot:
        """The step's snapshot (:func:`anatomy.hook.assembly.snapshot`) with the advisor's suggestions."""
        achieved, mfu = self._rates()
        self._seq += 1
        throughput = self._throughput
        facts = SnapshotFacts(
            pid=os.getpid(),
            seq=self._seq,
            time=time.time(),
            expected_bytes_per_param=self._expected_bytes(),
            parameter_count=self._param_count if self.enabled else 0,
            trainable_parameter_count=self._trainable_count if self.enabled else None,
            timing=throughput.timing,
            op_groups=throughput.op_groups,
            op_groups_step=throughput.op_groups_step,
            achieved_tflops=achieved,
            mfu=mfu,
            grad_accum_steps=self.grad_accum_steps,
            error=self.error,
        )
        snap = snapshot(result, facts, oom)
        # Every finished step is built and published; the advisor, the costliest part, runs once per
        # publish interval (and for an OOM record) and its suggestions stand in between.
        now = time.monotonic()
        if oom is not None or now - self._advised_at >= self.interval_s:
            self._suggestions = self._advise(snap)
            self._advised_at = now
        suggestions = self._suggestions
        if suggestions or snap.error != self.error:  # the advisor's own failure shows at once
            snap = replace(snap, suggestions=list(suggestions), error=self.error)
        return snap

    def _rates(self) -> tuple[float | None, float | None]:
        device_name = None
        tf32 = False
        if self._is_cuda:
            hello = self.hello
            device_name, tf32 = hello.device_name, bool(hello.tf32)
        return self._throughput.rates(device_name, self.precision, tf32)

    def _advise(self, snap: Snapshot) -> list[Suggestion]:
        if not self._guard.ok(Feature.ADVISOR):
            return []
        with self._guard(Feature.ADVISOR):
            out = advisor.advise(self.hello, snap, tuple(self.history), None)
            return [s for s in out if isinstance(s, Suggestion)][:64]
        return []

    def _publish_latest(self) -> None:
        snap = self._latest
        if snap is None:
            return
        self._unpublished = False
        if self._hello_stale:  # the set-up changed: the monitor learns it before this step
            self._hello_stale = False
            self._channel.set_hello(self.hello)
        self._channel.publish(snap, self.hello)

    def _write_oom(self, exc: BaseException) -> Path | None:
        """The last snapshot, with the error text, to the OOM file. Never raises."""
        # By id: holding the exception would keep its traceback's frames (and tensors) alive.
        if not self._channel.enabled or id(exc) == self._oom_recorded:
            return self._oom_path  # already written for this exception (step, then tracker, exit)
        self._oom_recorded = id(exc)
        with self._guard(Feature.OOM):
            snap = self._build(self._finished, oom=f"{type(exc).__name__}: {exc}")
            if snap is None:
                return None
            self._oom_path = self._channel.write_oom(snap, self.hello)
            return self._oom_path
        return None

    def record_oom(self, exc: BaseException) -> Path | None:
        """For wrappers that catch an exception outside a step (the Trainer callback): if it is an
        out-of-memory error, end the step in progress and write the OOM file."""
        if not self.enabled or not is_oom(exc):
            return None
        rec = self._step
        if rec is not None:
            self._finish_step(rec, exc)
        return self._write_oom(exc)

    # -- life cycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Detach every hook, publish the last snapshot and remove the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        rec = self._step
        if rec is not None and rec.suspended and not rec.updated and self._steps_done > 0:
            self._discard(rec)
        elif rec is not None:
            self._finish_step(rec, None)
        with self._guard(Feature.SETUP):
            self._detach()
        with self._guard(Feature.ACTIVATIONS):
            self._counter.stop()  # (a window of a forward outside any step)
        if self._unpublished:
            self._publish_latest()
        self._channel.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def socket_path(self) -> Path | None:
        return self._channel.path

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is not None and is_oom(exc):
            self.record_oom(exc)
        self.close()
        return False


def track(
    model: torch.nn.Module,
    optimizer: Any = None,
    *,
    publish: bool = True,
    interval_s: float = 0.5,
    sample_every: int = SAMPLE_EVERY,
    samples: int | None = None,
    tokens: int | None = None,
    grad_accum_steps: int = 1,
    precision: Precision | None = None,
    directory: Path | None = None,
    record: RecordSetting = None,
    others: Mapping[str, torch.nn.Module] | None = None,
) -> Tracker:
    """Attach the anatomy hook to ``model`` (and ``optimizer``). ``others``: the other models the step
    runs, by name (``{"teacher": teacher}``; or later ``tracker.add_model``). ``record``: the flight
    recorder (None: as ``ANATOMY_TOP_RECORD`` says, on by default; False: off; a path: record there).
    With ``ANATOMY_TOP=0`` in the environment this returns a tracker that does nothing (same API)."""
    return Tracker(
        model,
        optimizer,
        publish=publish,
        interval_s=interval_s,
        sample_every=sample_every,
        samples=samples,
        tokens=tokens,
        grad_accum_steps=grad_accum_steps,
        precision=precision,
        directory=directory,
        enabled=not hook_disabled(),
        record=record,
        others=others,
    )


__all__ = ["SAMPLE_EVERY", "WARMUP_REFRESH_STEPS", "Tracker", "hook_disabled", "track"]
