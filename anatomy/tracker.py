"""The in-process hook: ``tracker = anatomy.track(model, optimizer)``.

Phase boundaries come from hooks — the model's forward pre/post hooks and the optimizer's step
pre/post hooks — so the same code serves a plain loop and the Hugging Face Trainer. Step
boundaries come from ``tracker.step()`` / ``begin_step``/``end_step`` (or the Trainer callback); a
loop that uses neither still gets steps: a training-mode forward begins one and the optimizer step
ends it.

Every step measures cheaply (saved-tensor counting in the forward, an allocator reading at each
phase boundary, a clock mark); weights, gradients and optimizer states are re-summed on the first
steps and then once every ``sample_every`` steps, when the op-group profiler also runs. On CPU the
heap is read at the phase boundaries (glibc's ``mallinfo2`` walks the arenas: ~0.1 ms a read) on the
first steps, on sampled steps, after an input shape change and about once per publish interval; a
step in between reports the last read step's peak, temporaries and split (``at_peak_step`` names it).

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
unmeasured (None) and the snapshot's ``error`` says why. Only the user's own exceptions propagate.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch

from anatomy import protocol
from anatomy.memory import (
    CudaAllocator,
    GradientWatcher,
    HeapPeakMode,
    HostHeap,
    SavedTensorCounter,
    active_autocast_dtype,
    detect_optimizer,
    detect_precision,
    dominant_dtype,
    dtype_name,
    gradient_bytes,
    is_oom,
    optimizer_state_bytes,
    parameter_count,
    unwrap_optimizer,
    weight_bytes,
)
from anatomy.protocol import CudaMemory, Hello, OpGroupStat, Snapshot, Suggestion, Timing
from anatomy.timing import (
    BACKWARD_END,
    BEGIN,
    END,
    FORWARD_POST,
    FORWARD_PRE,
    OPTIMIZER_POST,
    OPTIMIZER_PRE,
    StepClock,
    StepDurations,
)
from anatomy.vocabulary import (
    MODEL_COMPONENTS,
    Component,
    OptimizerKind,
    Phase,
    Precision,
    expected_bytes_per_param,
)

log = logging.getLogger("anatomy")

HISTORY_LENGTH = 120
SAMPLE_EVERY = 100  # the op-group profiler runs on one step in this many (after the second step)
TRACE_EVERY = 5  # the per-op memory trace runs on one sampled step in this many
WARMUP_REFRESH_STEPS = 3  # weights/gradients/optimizer states re-summed on every one of the first steps
_NO_MEMORY: dict[str, int | None] = {c.value: None for c in Component}  # copied per snapshot
_MAX_TEXT = 4000  # protocol strings are capped at 4096


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


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


class _Step:
    """What one step has measured so far."""

    def __init__(self, index: int, auto: bool, samples: int | None, tokens: int | None, clock: StepClock):
        self.index = index
        self.auto = auto
        self.samples = samples
        self.tokens = tokens
        self.clock = clock
        self.micro = 0
        self.samples_seen = 0
        self.tokens_seen = 0
        self.activations: int | None = None
        self.weight_copies = 0
        self.grads_begin = 0
        self.opt_begin = 0
        self.grads: int | None = None
        self.opt_after: int | None = None
        self.heap0: int | None = None
        self.heap_on = True  # read the heap at this step's boundaries (CPU); else the last readings stand
        self.heap_from: int | None = None  # the step whose heap readings this one reports
        # (phase, heap in use, bytes of named tensors grown since the step began, held at that moment)
        self.heap_samples: list[tuple[Phase, int, int, Held]] = []
        self.cuda_m0: int | None = None
        self.cuda_phase = Phase.OTHER
        self.cuda_peaks: list[tuple[Phase, int]] = []
        self.cuda_end: Any = None
        self.profiler: Any = None
        self.heap_mode: Any = None
        self.grad_watch: GradientWatcher | None = None
        self.profiled = False
        self.in_forward = 0
        self.counting = False
        self.optimizer_ran = False


# (activations, autocast weight copies, gradients, optimizer states) held at one moment of a step
Held = tuple[int, int, int, int]


@dataclass(frozen=True)
class _Traced:
    """What the last per-op memory trace found; it stands for the steps until the next trace."""

    step: int
    growth: int  # the highest reading above the step's start
    phase: Phase
    temporaries: int  # the largest excess over the named tensors of any phase
    held: Held  # what the named tensors held at the highest reading


class _StepContext:
    __slots__ = ("_samples", "_tokens", "_tracker")

    def __init__(self, tracker: Tracker, samples: int | None, tokens: int | None) -> None:
        self._tracker = tracker
        self._samples = samples
        self._tokens = tokens

    def __enter__(self) -> Tracker:
        self._tracker.begin_step(samples=self._samples, tokens=self._tokens)
        return self._tracker

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
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


def _load(module: str, name: str) -> Any:
    """A sibling module's entry point, or None while it does not exist (or fails to import)."""
    try:
        mod = __import__(f"anatomy.{module}", fromlist=[name])
        return getattr(mod, name)
    except Exception as exc:  # an optional collaborator must never break the hook
        log.debug("anatomy: %s.%s unavailable: %s", module, name, exc)
        return None


class Tracker:
    """Measures each training step of ``model`` (and ``optimizer``) and publishes a snapshot per step.

    Use ``with tracker.step(samples=..., tokens=...):`` around each optimizer step (or
    ``begin_step``/``end_step``), then ``close()`` (or use the tracker as a context manager).
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
    ) -> None:
        self.enabled = enabled
        self.model = model
        self.interval_s = float(interval_s)
        self.sample_every = int(sample_every)
        self.default_samples = samples
        self.default_tokens = tokens
        self.grad_accum_steps = max(int(grad_accum_steps or 1), 1)
        self.history: deque[Snapshot] = deque(maxlen=HISTORY_LENGTH)
        self._publish = publish
        self._directory = directory
        self._precision_override = precision
        self._optimizer: Any = None
        self._opt_handles: list[Any] = []
        self._handles: list[Any] = []
        self._step: _Step | None = None
        self._explicit = False
        self._closed = False
        self._steps_done = 0
        self._seq = 0
        self._latest: Snapshot | None = None
        self._dirty = False
        self._last_built = 0.0
        self._errors: dict[str, str] = {}
        self._disabled: set[str] = set()
        self._publisher: Any = None
        self._publisher_tried = False
        self._hello: Hello | None = None
        self._started_at = time.time()
        self._pending_clocks: deque[tuple[_Step, StepClock]] = deque()
        self._timing = Timing()
        self._timing_step: int | None = None
        self._recent_step_s: deque[float] = deque(maxlen=9)
        self._pending_profile: tuple[int, Any] | None = None
        self._op_groups: dict[str, OpGroupStat] | None = None
        self._op_groups_step: int | None = None
        self._step_flops: float | None = None
        self._last_rec: _Step | None = None
        self._timing_rec: tuple[_Step, StepClock] | None = None
        self._cuda_end: Any = None
        self._acts_known: int | None = None
        self._copies_known = 0
        self._acts_shape: tuple[int, ...] | None = None
        self._acts_index = -1
        # (step, heap at its start, its boundary readings) of the last step that read the heap
        self._heap_last: tuple[int, int, list[tuple[Phase, int, int, Held]]] | None = None
        self._retrace = False
        self._traced: _Traced | None = None
        self._balance_logged = False
        self._suggestions: list[Suggestion] = []
        self._advised_at = -1e9
        self._expected: tuple[tuple[Precision, OptimizerKind], dict[str, float | None]] | None = None
        self._autocast_dtype: torch.dtype | None = None
        self._grad_scaler = False
        self._oom_recorded: int | None = None
        self._oom_path: Path | None = None
        if not enabled:
            return
        try:
            self._setup(model, optimizer)
        except Exception as exc:
            self._fail("setup", exc)
            self.enabled = False

    # -- set-up -----------------------------------------------------------------------------------

    def _setup(self, model: torch.nn.Module, optimizer: Any) -> None:
        params = list(model.parameters())
        self._params = params
        self._param_count = parameter_count(model)
        self._param_dtype = dominant_dtype(model)
        self._counter = SavedTensorCounter(params)
        self._device = torch.device("meta")  # set by _use_device below
        self._cuda = self._cuda_events = False
        self._heap: HostHeap | None = None
        self._allocator: CudaAllocator | None = None
        self._refresh_weights()
        self._grad_bytes = gradient_bytes(params)
        self._opt_bytes = 0
        self._handles.append(model.register_forward_pre_hook(self._on_forward_pre, with_kwargs=True))
        self._handles.append(model.register_forward_hook(self._on_forward_post, always_call=True))
        self.attach_optimizer(optimizer)

    def attach_optimizer(self, optimizer: Any) -> None:
        """Track this optimizer's steps (the Trainer creates its optimizer after the model)."""
        if not self.enabled or optimizer is None:
            return
        try:
            opt = unwrap_optimizer(optimizer)
            if opt is self._optimizer:
                return
            for h in self._opt_handles:
                h.remove()
            self._opt_handles = []
            self._optimizer = opt
            if hasattr(opt, "register_step_pre_hook"):
                self._opt_handles.append(opt.register_step_pre_hook(self._on_optimizer_pre))
                self._opt_handles.append(opt.register_step_post_hook(self._on_optimizer_post))
            self._hello = None
        except Exception as exc:
            self._fail("optimizer", exc)
            return
        try:
            self._opt_bytes = optimizer_state_bytes(opt)
        except Exception as exc:
            self._fail("optimizer_states", exc)

    def set_precision(self, precision: Precision | None = None, *, grad_scaler: bool | None = None) -> None:
        """Tell the tracker what it cannot see (e.g. the Trainer's fp16/bf16 flags)."""
        if precision is not None:
            self._precision_override = precision
        if grad_scaler is not None:
            self._grad_scaler = grad_scaler
        self._hello = None

    def _refresh_weights(self) -> None:
        by_dtype = weight_bytes(self.model)
        self._weights_by_dtype = by_dtype
        self._weights = sum(by_dtype.values())
        self._params = list(self.model.parameters())
        self._counter.set_params(self._params)
        trainable = [p for p in self._params if p.requires_grad]
        candidates = trainable or self._params
        self._probe_param = candidates[0] if candidates else None
        self._probe_ptr = self._probe_param.data_ptr() if self._probe_param is not None else 0
        device = self._probe_param.device if self._probe_param is not None else torch.device("cpu")
        if device != self._device:
            self._use_device(device)

    def _use_device(self, device: torch.device) -> None:
        """Measure on this device: the caching allocator's statistics on CUDA, else glibc's heap."""
        self._device = device
        self._cuda = device.type == "cuda"
        self._cuda_events = self._cuda  # phase times from CUDA events, else the host clock
        self._hello = None
        self._traced = None  # a trace of another device's memory says nothing about this one
        if self._cuda:
            self._allocator, self._heap = CudaAllocator(device), None
            return
        self._allocator = None
        if self._heap is None:
            self._heap = HostHeap()
            if not self._heap.available:
                self._disabled.add("heap")

    # -- failure handling -------------------------------------------------------------------------

    def _fail(self, where: str, exc: BaseException) -> None:
        """Log once per place, remember why, and stop measuring that part."""
        self._disabled.add(where)
        if where not in self._errors:
            text = f"{where}: {type(exc).__name__}: {exc}"
            self._errors[where] = text[:_MAX_TEXT]
            log.warning(
                "anatomy: %s failed (%s: %s); it is reported as unmeasured from now on",
                where,
                type(exc).__name__,
                exc,
            )

    def _ok(self, feature: str) -> bool:
        return feature not in self._disabled

    @property
    def error(self) -> str | None:
        if not self._errors:
            return None
        return "; ".join(self._errors.values())[:_MAX_TEXT]

    # -- step boundaries --------------------------------------------------------------------------

    def step(self, samples: int | None = None, tokens: int | None = None) -> _StepContext | _NullContext:
        """Context manager around one optimizer step (all its micro-batches)."""
        if not self.enabled or self._closed:
            return _NullContext(self)
        return _StepContext(self, samples, tokens)

    def begin_step(self, samples: int | None = None, tokens: int | None = None) -> None:
        if not self.enabled or self._closed:
            return
        self._explicit = True
        if self._step is not None:
            self.end_step()
        self._begin(auto=False, samples=samples, tokens=tokens)

    def _begin(self, auto: bool, samples: int | None = None, tokens: int | None = None) -> None:
        try:
            index = self._steps_done
            if self._probe_param is not None and self._probe_param.data_ptr() != self._probe_ptr:
                self._refresh_weights()  # the model moved (.to(), a new device) since the last look
            clock = StepClock(cuda=self._cuda_events and self._ok("timing"))
            rec = _Step(index, auto, samples, tokens, clock)
            self._step = rec
            rec.opt_begin = self._opt_bytes
            probe = self._probe_param
            rec.grads_begin = self._grad_bytes if probe is not None and probe.grad is not None else 0
            if self._refresh_due(index):
                self._refresh_weights()
                rec.grads_begin = gradient_bytes(self._params)
            rec.heap_on = self._heap_due(index)
            self._sample_memory(rec, None, 0, (0, 0, rec.grads_begin, rec.opt_begin), begin=True)
            if self._ok("timing"):
                rec.clock.mark(BEGIN)
            if self._sample_due(index):
                if self._ok("op_groups"):
                    self._start_profiler(rec)
                if self._trace_due(index):
                    self._start_heap_trace(rec)
        except Exception as exc:
            self._fail("step", exc)

    def _refresh_due(self, index: int) -> bool:
        return index < WARMUP_REFRESH_STEPS or (self.sample_every > 0 and index % self.sample_every == 0)

    def _every_interval(self) -> int:
        """Steps in one publish interval, counted in the run's median step duration (so time spent
        outside steps, e.g. evaluation, does not make the per-interval work more frequent)."""
        step_s = statistics.median(self._recent_step_s) if self._recent_step_s else 0.0
        return max(1, int(self.interval_s / step_s)) if step_s > 0 else 1

    def _heap_due(self, index: int) -> bool:
        """Read the heap at this step's boundaries (CPU)? Three reads cost ~0.35 ms a step on a real
        training heap, and in steady state each step's readings repeat the last ones; so on the first
        steps, sampled steps, after a shape change (also caught at the forward) and about once per
        publish interval."""
        last = self._heap_last
        if last is None or index < WARMUP_REFRESH_STEPS:
            return True
        if self._sample_due(index) or self._refresh_due(index):
            return True
        return index - last[0] >= self._every_interval()

    def _sample_due(self, index: int) -> bool:
        # Never the first (warm-up) step; then the second one, so short runs see op groups too.
        if self.sample_every <= 0 or index == 0:
            return False
        return index == 1 or index % self.sample_every == 0

    def _trace_due(self, index: int) -> bool:
        """The per-op heap trace (CPU) costs about as much as the op-group profiler; the peak it finds
        changes only with the shapes, so it runs on the first sampled step, after an input shape
        change, and on every TRACE_EVERY-th sampled step."""
        if self._traced is None or self._retrace:
            return True
        return index % (self.sample_every * TRACE_EVERY) == 0

    def _trace_reader(self) -> Any:
        """Memory in use, read after every op of a traced step: the glibc heap on CPU, the caching
        allocator's allocated bytes on CUDA (a host-side counter: no synchronization)."""
        if self._cuda:
            alloc = self._allocator
            return alloc.allocated if alloc is not None and self._ok("cuda") else None
        heap = self._heap
        return heap.in_use if heap is not None and self._ok("heap") else None

    def _probe_held(self) -> tuple[int, int, int]:
        rec = self._step
        watch = rec.grad_watch if rec is not None else None
        counter = self._counter
        return counter.alive_activation_bytes, counter.alive_copy_bytes, watch.bytes if watch else 0

    def _start_heap_trace(self, rec: _Step) -> None:
        read = self._trace_reader()
        if read is None or not self._ok("heap_trace"):
            return
        try:
            rec.grad_watch = GradientWatcher(self._params)
            self._counter.track_alive = True
            mode = HeapPeakMode(read=read, probe=self._probe_held)
            mode.phase = Phase.OTHER
            mode.__enter__()
            rec.heap_mode = mode
            rec.counting = True  # the trace needs this step's saved tensors
            self._retrace = False
            rec.profiled = True
        except Exception as exc:
            self._end_watch(rec)
            self._fail("heap_trace", exc)

    def _end_watch(self, rec: _Step) -> None:
        self._counter.track_alive = False
        watch, rec.grad_watch = rec.grad_watch, None
        if watch is not None:
            try:
                watch.close()
            except Exception as exc:
                self._fail("heap_trace", exc)

    def _stop_heap_trace(self, rec: _Step) -> None:
        mode, rec.heap_mode = rec.heap_mode, None
        self._end_watch(rec)
        try:
            mode.__exit__(None, None, None)
        except Exception as exc:
            self._fail("heap_trace", exc)
            return
        start = rec.cuda_m0 if self._cuda else rec.heap0
        if mode.failed or start is None or not mode.peaks:
            return
        parts = self._parts(rec)
        growth = [(ph, peak - start) for ph, peak in mode.peaks.items()]
        phase, top = max(growth, key=lambda g: g[1])
        temporaries = max(max(g - self._explained(rec, ph, parts) for ph, g in growth), 0)
        m = mode.moments[phase]
        in_step = phase in (Phase.FORWARD, Phase.BACKWARD)
        opt = rec.opt_begin if in_step else (rec.opt_after if rec.opt_after is not None else self._opt_bytes)
        held = (m.activations, m.weight_copies, m.gradients, opt)
        self._traced = _Traced(rec.index, max(top, 0), phase, temporaries, held)

    def end_step(self, exc: BaseException | None = None) -> None:
        """Close the current step. With ``exc`` (the exception that ended it), an out-of-memory
        error writes the last snapshot with the error text to the OOM file."""
        rec = self._step
        if not self.enabled or rec is None:
            if exc is not None and self.enabled and is_oom(exc):
                self._write_oom(exc)
            return
        self._step = None
        try:
            self._counter.stop()
        except Exception as err:
            self._fail("activations", err)
        try:
            self._finish(rec, exc)
        except Exception as err:
            self._fail("step", err)
        if exc is not None and is_oom(exc):
            self._write_oom(exc)

    def _finish(self, rec: _Step, exc: BaseException | None) -> None:
        if rec.heap_mode is not None:  # entered after the profiler: leaves first
            self._stop_heap_trace(rec)
        if rec.profiler is not None:
            self._stop_profiler(rec, exc)
        if self._ok("timing"):
            rec.clock.mark(END)
        if not rec.optimizer_ran:  # otherwise the optimizer's samples already cover the step's end
            explained = self._explained_after_optimizer(rec)
            self._sample_memory(rec, Phase.OTHER, explained, self._held_after(rec))
        self._heap_readings(rec)
        due = exc is not None or self._steps_done == 0
        due = due or time.monotonic() - self._last_built >= self.interval_s
        if self._cuda:
            self._cuda_boundary(rec, Phase.OTHER)
            if self._ok("cuda") and due:  # a full statistics read (~0.1 ms) only for a snapshot
                try:
                    self._cuda_end = self._allocator.stats() if self._allocator else None
                except Exception as err:
                    self._fail("cuda", err)
            rec.cuda_end = self._cuda_end
        if rec.grads is None and self._refresh_due(rec.index) and self._ok("gradients"):
            # No optimizer hook saw this step: gradients as they are now.
            try:
                rec.grads = gradient_bytes(self._params)
                self._grad_bytes = rec.grads
            except Exception as exc:
                self._fail("gradients", exc)
        self._steps_done += 1
        if self._ok("timing"):
            self._pending_clocks.append((rec, rec.clock))
        self._resolve_pending()
        self._last_rec = rec  # turned into numbers only when a snapshot is built
        self._dirty = True
        if exc is None:  # every finished step goes to the publisher (latest-only, O(1))
            self._publish_now()

    # -- hooks ------------------------------------------------------------------------------------

    def _on_forward_pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        count = False
        try:
            rec = self._step
            if rec is None:
                if self._explicit or self._closed or not (torch.is_grad_enabled() and module.training):
                    return
                self._begin(auto=True)
                rec = self._step
                if rec is None:
                    return
            if not torch.is_grad_enabled():
                return
            rec.in_forward += 1
            if rec.in_forward > 1:
                return  # re-entrant call of the same model inside its forward
            rec.micro += 1
            x = _first_tensor(args, kwargs)
            shape = tuple(x.shape) if x is not None else None
            if x is not None and x.dim() >= 1 and (rec.samples is None or rec.tokens is None):
                rec.samples_seen += int(x.shape[0])
                if x.dim() >= 2 and not x.is_floating_point():
                    rec.tokens_seen += int(x.numel())
            ac = active_autocast_dtype(self._device.type)
            if ac is not None:
                self._autocast_dtype = ac
            if self._ok("activations"):
                count = self._count_due(rec, shape) or rec.heap_mode is not None
            if not rec.heap_on and rec.micro == 1 and (count or shape != self._acts_shape):
                # A new shape (or a count due): read this step's heap after all, from here (nothing
                # of the step has been allocated yet).
                rec.heap_on = True
                self._sample_memory(rec, None, 0, (0, 0, rec.grads_begin, rec.opt_begin), begin=True)
            self._boundary(rec, Phase.FORWARD)
            if self._ok("timing"):
                rec.clock.mark(FORWARD_PRE)
        except Exception as exc:
            self._fail("forward", exc)
            return
        if count:
            try:
                self._counter.reset()
                self._counter.start()
            except Exception as exc:  # e.g. saved-tensor hooks disabled by a compiler or FSDP
                self._fail("activations", exc)

    def _count_due(self, rec: _Step, shape: tuple[int, ...] | None) -> bool:
        """Count saved tensors on this forward? Packing costs a few microseconds per saved tensor, so
        they are counted on the first steps, whenever the input shape changes, and otherwise about
        once per publish interval (the same shapes save the same bytes). The interval is counted in
        steps of the run's own median duration, so time the process spends elsewhere (evaluation,
        checkpointing) does not make counting more frequent."""
        first_steps = rec.index < WARMUP_REFRESH_STEPS
        if rec.counting or first_steps or shape != self._acts_shape:
            rec.counting = True
        else:
            rec.counting = rec.index - self._acts_index >= self._every_interval()
        if rec.counting:
            if shape != self._acts_shape and not first_steps:
                self._retrace = True
            self._acts_shape = shape
        return rec.counting

    def _on_forward_post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        try:
            rec = self._step
            if rec is None or rec.in_forward == 0:
                return
            rec.in_forward -= 1
            if rec.in_forward > 0:
                return
            if self._counter.active:
                self._counter.stop()
                acts = self._counter.activation_bytes
                copies = self._counter.weight_copy_bytes
                rec.activations = acts if rec.activations is None else max(rec.activations, acts)
                rec.weight_copies = max(rec.weight_copies, copies)
                self._acts_known, self._copies_known = rec.activations, rec.weight_copies
                self._acts_index = rec.index
                if self._counter.weight_copy_dtype is not None:
                    self._autocast_dtype = self._counter.weight_copy_dtype
            else:  # not counted this time: the last count stands
                acts, copies = self._acts_known or 0, self._copies_known
            if self._ok("timing"):
                rec.clock.mark(FORWARD_POST)
            earlier_grads = max(self._grad_bytes - rec.grads_begin, 0) if rec.micro > 1 else 0
            held = (acts, copies, rec.grads_begin + earlier_grads, rec.opt_begin)
            self._sample_memory(rec, Phase.FORWARD, acts + copies + earlier_grads, held)
            self._boundary(rec, Phase.BACKWARD)
        except Exception as exc:
            self._fail("forward", exc)

    def _on_optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_begin()

    def _on_optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.optimizer_end()

    def backward_end(self) -> None:
        """A micro-batch's backward is done (the Trainer's ``on_substep_end``): its gradients exist."""
        rec = self._step
        if not self.enabled or rec is None or rec.in_forward:
            return
        try:
            if self._ok("timing"):
                rec.clock.mark(BACKWARD_END)
            held = (0, 0, max(self._grad_bytes, rec.grads_begin), rec.opt_begin)
            self._sample_memory(rec, Phase.BACKWARD, max(self._grad_bytes - rec.grads_begin, 0), held)
        except Exception as exc:
            self._fail("backward", exc)

    def optimizer_begin(self) -> None:
        """Gradients are complete: measure them, and start the optimizer phase. Called by the
        optimizer's step pre-hook; the Trainer callback calls it too (a second call is ignored)."""
        rec = self._step
        if not self.enabled or rec is None or rec.optimizer_ran or rec.in_forward:
            return
        try:
            rec.optimizer_ran = True
            if self._ok("gradients") and rec.grads is None and self._refresh_due(rec.index):
                try:
                    self._grad_bytes = gradient_bytes(self._params)
                except Exception as exc:
                    self._fail("gradients", exc)
            rec.grads = self._grad_bytes
            held = (0, 0, rec.grads, rec.opt_begin)
            self._sample_memory(rec, Phase.BACKWARD, max(rec.grads - rec.grads_begin, 0), held)
            self._boundary(rec, Phase.OPTIMIZER)
            if self._ok("timing"):
                rec.clock.mark(OPTIMIZER_PRE)
            if rec.profiler is not None:
                rec.profiler.set_phase(Phase.OPTIMIZER)
        except Exception as exc:
            self._fail("optimizer", exc)

    def optimizer_end(self) -> None:
        """The optimizer step is done: its states exist now. Ends an automatic step."""
        rec = self._step
        if not self.enabled or rec is None or not rec.optimizer_ran or rec.opt_after is not None:
            return
        try:
            if self._ok("timing"):
                rec.clock.mark(OPTIMIZER_POST)
            if self._optimizer is not None and self._ok("optimizer_states") and self._refresh_due(rec.index):
                try:
                    self._opt_bytes = optimizer_state_bytes(self._optimizer)
                except Exception as exc:
                    self._fail("optimizer_states", exc)
            rec.opt_after = self._opt_bytes
            if self._refresh_due(rec.index):  # in steady state the heap after the step equals before
                explained = self._explained_after_optimizer(rec)
                self._sample_memory(rec, Phase.OPTIMIZER, explained, self._held_after(rec))
            self._boundary(rec, Phase.OTHER)
        except Exception as exc:
            self._fail("optimizer", exc)
        if rec.auto:
            self.end_step()

    # -- measurements -----------------------------------------------------------------------------

    def _heap_readings(self, rec: _Step) -> None:
        """Keep a read step's heap readings; give a step that did not read the last ones."""
        if self._cuda:
            return
        if rec.heap_on:
            if rec.heap0 is not None and rec.heap_samples:
                self._heap_last = (rec.index, rec.heap0, rec.heap_samples)
            return
        last = self._heap_last
        if last is not None:
            rec.heap_from, rec.heap0, rec.heap_samples = last

    @staticmethod
    def _explained_after_optimizer(rec: _Step) -> int:
        grads = max((rec.grads or 0) - rec.grads_begin, 0)
        states = max((rec.opt_after if rec.opt_after is not None else rec.opt_begin) - rec.opt_begin, 0)
        return grads + states

    def _held_after(self, rec: _Step) -> Held:
        """Held after the optimizer (or at a step's end without one): gradients and states, no activations."""
        grads = rec.grads if rec.grads is not None else self._grad_bytes
        opt = rec.opt_after if rec.opt_after is not None else self._opt_bytes
        return (0, 0, grads, opt)

    def _sample_memory(
        self, rec: _Step, phase: Phase | None, explained: int, held: Held, begin: bool = False
    ) -> None:
        heap = self._heap
        if heap is None or not rec.heap_on or not self._ok("heap"):
            return
        try:
            now = heap.in_use()
        except Exception as exc:
            self._fail("heap", exc)
            return
        if now is None:
            return
        if begin or rec.heap0 is None:
            rec.heap0 = now
            if begin:
                return
        rec.heap_samples.append((phase or Phase.OTHER, now, explained, held))

    def _boundary(self, rec: _Step, next_phase: Phase) -> None:
        """A phase ends and ``next_phase`` begins: close the allocator's peak window (CUDA) and
        tell the sampled step's heap trace (CPU)."""
        if rec.heap_mode is not None:
            rec.heap_mode.phase = next_phase
        if self._cuda:
            self._cuda_boundary(rec, next_phase)

    def _cuda_boundary(self, rec: _Step, next_phase: Phase) -> None:
        alloc = self._allocator
        if alloc is None or not self._ok("cuda"):
            return
        try:
            if rec.cuda_m0 is None:
                alloc.peak_and_reset()
                rec.cuda_m0 = alloc.allocated()
            else:
                rec.cuda_peaks.append((rec.cuda_phase, alloc.peak_and_reset()))
            rec.cuda_phase = next_phase
        except Exception as exc:
            self._fail("cuda", exc)

    def _parts(self, rec: _Step) -> dict[str, int]:
        """Bytes of the named tensors of a step (last counts where this step did not count)."""
        counted = rec.activations is not None
        acts = rec.activations if counted else self._acts_known
        copies = rec.weight_copies if counted else self._copies_known
        grads = rec.grads if rec.grads is not None else self._grad_bytes
        opt = rec.opt_after if rec.opt_after is not None else self._opt_bytes
        return {
            "acts": acts or 0,
            "copies": copies,
            "grads": grads,
            "opt": opt,
            "new_grads": max(grads - rec.grads_begin, 0),
            "new_states": max(opt - rec.opt_begin, 0),
            "begin": self._weights + rec.opt_begin + rec.grads_begin,
            "acts_known": int(acts is not None),
        }

    @staticmethod
    def _explained(rec: _Step, phase: Phase, parts: dict[str, int]) -> int:
        """What named tensors account for of a phase's peak growth above the step's start. In
        backward, activations are freed as gradients appear: the larger of the two is held."""
        held = parts["acts"] + parts["copies"]
        if phase is Phase.FORWARD:
            return held + (parts["new_grads"] if rec.micro > 1 else 0)
        if phase is Phase.BACKWARD:
            return max(held, parts["new_grads"])
        # The optimizer phase, and after it (zero_grad, the step's end): gradients and new states.
        return parts["new_grads"] + parts["new_states"]

    def _memory_result(self, rec: _Step) -> dict[str, Any]:
        """Component bytes of the finished step, its peak and where the peak was."""
        parts = self._parts(rec)
        memory: dict[str, int | None] = dict(_NO_MEMORY)
        memory[Component.WEIGHTS.value] = self._weights + parts["copies"]
        if not self._ok("optimizer_states"):
            memory[Component.OPTIMIZER_STATES.value] = None
        else:
            memory[Component.OPTIMIZER_STATES.value] = parts["opt"] if self._optimizer is not None else 0
        memory[Component.GRADIENTS.value] = parts["grads"] if self._ok("gradients") else None
        if self._ok("activations") and parts["acts_known"]:
            memory[Component.ACTIVATIONS.value] = parts["acts"]
        peak: int | None = None
        phase: Phase | None = None
        source = "none"
        cuda: CudaMemory | None = None
        at_peak: dict[str, int | None] | None = None
        at_peak_step: int | None = None
        if self._cuda and rec.cuda_m0 is not None and rec.cuda_peaks and self._ok("cuda"):
            source = "cuda_allocator"
            phase, peak = max(rec.cuda_peaks, key=lambda pp: pp[1])
            temporaries = max(peak - rec.cuda_m0 - self._explained(rec, phase, parts), 0)
            memory[Component.TEMPORARIES.value] = temporaries
            memory[Component.UNATTRIBUTED.value] = max(rec.cuda_m0 - parts["begin"], 0)
            traced = self._traced
            if traced is not None and traced.phase is phase:
                held, at_peak_step = traced.held, traced.step
            else:  # no trace of this phase yet: what the phase's boundaries say is held in it
                held, at_peak_step = self._held_in_phase(rec, phase, parts), rec.index
            at_peak = self._at_peak(peak, rec.cuda_m0 - parts["begin"], held)
            end = rec.cuda_end
            if end is not None:
                memory[Component.ALLOCATOR_CACHE.value] = max(end.reserved - end.allocated, 0)
                cuda = CudaMemory(
                    allocated=end.allocated,
                    reserved=end.reserved,
                    peak_allocated=peak,
                    alloc_retries=end.alloc_retries,
                    ooms=end.ooms,
                )
        elif rec.heap0 is not None and rec.heap_samples and self._ok("heap"):
            source = "glibc"
            heap0 = rec.heap0
            temporaries = max(max(h - heap0 - ex for _, h, ex, _ in rec.heap_samples), 0)
            # The split at the peak comes from the per-op trace, which sees inside the phases; the
            # boundary readings give it only before the first trace, or when they rise clearly above
            # the traced peak (the shapes changed: a new trace is due). The peak itself is the highest
            # reading either way; what the split does not name goes to temporaries.
            ph0, top, _, held0 = max(rec.heap_samples, key=lambda sample: sample[1])
            read_at = rec.heap_from if rec.heap_from is not None else rec.index
            peak, phase, held, at_peak_step = top, ph0, held0, read_at
            traced = self._traced
            if traced is not None:
                temporaries = max(temporaries, traced.temporaries)
                traced_peak = heap0 + traced.growth
                if traced.step == rec.index or top - heap0 <= traced.growth * 1.1:
                    peak, phase, held, at_peak_step = traced_peak, traced.phase, traced.held, traced.step
                    if traced.step != rec.index:
                        peak = max(peak, top)
            peak = max(peak, heap0)
            memory[Component.TEMPORARIES.value] = temporaries
            rest = heap0 - parts["begin"]
            memory[Component.UNATTRIBUTED.value] = rest if rest >= 0 else None
            at_peak = self._at_peak(peak, rest, held)
        return {
            "step": rec.index,
            "memory": memory,
            "peak": peak,
            "phase": phase.value if phase is not None else None,
            "source": source,
            "cuda": cuda,
            "micro": rec.micro,
            "batch": self._batch_size(rec),
            "at_peak": at_peak if at_peak is not None and self._named_measured() else None,
            "at_peak_step": at_peak_step if at_peak is not None and self._named_measured() else None,
        }

    def _named_measured(self) -> bool:
        return all(self._ok(f) for f in ("optimizer_states", "gradients", "activations"))

    @staticmethod
    def _held_in_phase(rec: _Step, phase: Phase, parts: dict[str, int]) -> Held:
        """Without a per-op trace: what is held at a phase's peak. In forward and early backward
        (where a backward peak lies: the activations not yet freed, the first gradients being made)
        the activations are all held; after backward, gradients and the optimizer's states."""
        if phase in (Phase.FORWARD, Phase.BACKWARD):
            earlier = parts["new_grads"] if rec.micro > 1 else 0
            return (parts["acts"], parts["copies"], rec.grads_begin + earlier, rec.opt_begin)
        return (0, 0, parts["grads"], parts["opt"])

    def _at_peak(self, peak: int, unattributed: int, held: Held) -> dict[str, int | None]:
        """The step's peak split into what each component held at its moment, summing to ``peak``.

        Unattributed (memory in use at the step's start beyond weights, optimizer states and gradients)
        is constant through the step; temporaries are the rest of the peak. If the named tensors and
        the unattributed part exceed the peak (a trace from an earlier step, gradients freed before the
        reading), temporaries are 0 and the excess comes off unattributed first, so the sum holds."""
        acts, copies, grads, opt = held
        out: dict[str, int] = {
            Component.WEIGHTS.value: self._weights + copies,
            Component.OPTIMIZER_STATES.value: opt,
            Component.GRADIENTS.value: grads,
            Component.ACTIVATIONS.value: acts,
            Component.UNATTRIBUTED.value: max(unattributed, 0),
        }
        rest = peak - sum(out.values())
        if rest < 0:
            excess = -rest
            if not self._balance_logged:
                self._balance_logged = True
                log.info(
                    "anatomy: the named tensors exceed the step's peak by %d bytes; taken off unattributed",
                    excess,
                )
            for key in (
                Component.UNATTRIBUTED.value,
                Component.ACTIVATIONS.value,
                Component.GRADIENTS.value,
                Component.OPTIMIZER_STATES.value,
                Component.WEIGHTS.value,
            ):
                take = min(excess, out[key])
                out[key] -= take
                excess -= take
            rest = 0
        out[Component.TEMPORARIES.value] = rest
        return dict(out)

    def _batch_size(self, rec: _Step) -> int | None:
        """Samples per micro-batch: given per step (or at track()), else counted from the inputs."""
        if rec.micro <= 0:
            return None
        samples = rec.samples if rec.samples is not None else self.default_samples
        if samples is None:
            samples = rec.samples_seen or None
        return max(int(samples // rec.micro), 1) if samples else None

    # -- timing and op groups ---------------------------------------------------------------------

    def _resolve_pending(self) -> None:
        while self._pending_clocks:
            rec, clock = self._pending_clocks[0]
            try:
                ready = clock.ready()
                step_s = clock.span() if ready else None
            except Exception as exc:
                self._pending_clocks.clear()
                self._fail("timing", exc)
                return
            if step_s is None:
                if len(self._pending_clocks) > 64:  # a stream that never completes: drop the oldest
                    self._pending_clocks.popleft()
                    continue
                break
            self._pending_clocks.popleft()
            self._timing_rec = (rec, clock)
            if not rec.profiled and rec.index > 0 and step_s > 0:
                self._recent_step_s.append(step_s)
        pending = self._pending_profile
        if pending is not None:
            index, prof = pending
            try:
                result = prof.result()
            except Exception as exc:
                self._pending_profile = None
                self._fail("op_groups", exc)
                return
            if result is not None:
                self._pending_profile = None
                self._op_groups = {getattr(g, "value", str(g)): stat for g, stat in result.items()}
                self._op_groups_step = index
                flops = getattr(prof, "total_flops", None)
                self._step_flops = float(flops) if flops else None

    def _set_timing(self, rec: _Step, d: StepDurations) -> None:
        samples = rec.samples if rec.samples is not None else self.default_samples
        if samples is None and rec.samples_seen:
            samples = rec.samples_seen
        tokens = rec.tokens if rec.tokens is not None else self.default_tokens
        if tokens is None and rec.tokens_seen:
            tokens = rec.tokens_seen
        step_s = d.step_s
        self._timing = Timing(
            step_s=step_s,
            forward_s=d.forward_s,
            backward_s=d.backward_s,
            optimizer_s=d.optimizer_s,
            samples_per_s=samples / step_s if samples and step_s > 0 else None,
            tokens_per_s=tokens / step_s if tokens and step_s > 0 else None,
        )
        self._timing_step = rec.index

    def _start_profiler(self, rec: _Step) -> None:
        profiler_cls = _load("opgroups", "OpGroupProfiler")
        if profiler_cls is None:
            self._disabled.add("op_groups")
            return
        try:
            prof = profiler_cls()
            prof.__enter__()
            rec.profiler = prof
            rec.profiled = True
        except Exception as exc:
            self._fail("op_groups", exc)

    def _stop_profiler(self, rec: _Step, exc: BaseException | None) -> None:
        prof, rec.profiler = rec.profiler, None
        try:
            if exc is None:
                prof.__exit__(None, None, None)
            else:
                prof.__exit__(type(exc), exc, exc.__traceback__)
            if exc is None:
                self._pending_profile = (rec.index, prof)
        except Exception as err:
            self._fail("op_groups", err)

    def _throughput(self) -> tuple[float | None, float | None]:
        if not self._step_flops or not self._recent_step_s:
            return None, None
        step_s = statistics.median(self._recent_step_s)
        if step_s <= 0:
            return None, None
        achieved = self._step_flops / step_s
        mfu = None
        if self._cuda:
            peak_flops = _load("peaks", "peak_flops")
            if peak_flops is not None:
                try:
                    name = torch.cuda.get_device_name(self._device)
                    try:
                        peak = peak_flops(name, self.precision, tf32=bool(self.hello.tf32))
                    except TypeError:  # a peaks table without the tf32 switch
                        peak = peak_flops(name, self.precision)
                    mfu = achieved / peak if peak else None
                except Exception as exc:
                    self._fail("mfu", exc)
        return achieved / 1e12, mfu

    # -- set-up as detected -----------------------------------------------------------------------

    @property
    def precision(self) -> Precision:
        if self._precision_override is not None:
            return self._precision_override
        return detect_precision(
            param_dtype=self._param_dtype if self.enabled else torch.float32,
            autocast_dtype=self._autocast_dtype,
            grad_scaler=self._grad_scaler,
        )

    @property
    def optimizer_kind(self) -> OptimizerKind:
        return detect_optimizer(self._optimizer)

    @property
    def hello(self) -> Hello:
        if self._hello is None:
            self._hello = self._build_hello()
        return self._hello

    def _build_hello(self) -> Hello:
        opt = self._optimizer
        device = str(self._device) if self.enabled else "cpu"
        try:
            count = parameter_count(self.model)
            dtype = dtype_name(dominant_dtype(self.model))
        except Exception:
            count, dtype = 0, "float32"
        return Hello(
            pid=os.getpid(),
            host=socket.gethostname(),
            device=device,
            precision=self.precision.value,
            optimizer=self.optimizer_kind.value,
            model_class=type(self.model).__name__,
            parameter_count=count,
            torch_version=torch.__version__,
            started_at=self._started_at,
            rank=_env_int("RANK"),
            local_rank=_env_int("LOCAL_RANK"),
            world_size=_env_int("WORLD_SIZE"),
            dtype=dtype,
            optimizer_class=type(opt).__name__ if opt is not None else "",
            **self._device_facts(),
        )

    def _device_facts(self) -> dict[str, Any]:
        """The optional hello fields the advisor uses (GPU name and memory, TF32, vocabulary)."""
        facts: dict[str, Any] = {}
        vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
        if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
            facts["vocab_size"] = vocab
        if self.enabled and self._cuda:
            try:
                props = torch.cuda.get_device_properties(self._device)
                facts["device_name"] = str(props.name)
                facts["device_memory_bytes"] = int(props.total_memory)
                facts["tf32"] = bool(
                    torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
                )
            except Exception as exc:
                self._fail("device", exc)
        known = Hello.__dataclass_fields__
        return {k: v for k, v in facts.items() if k in known}

    # -- snapshots and publishing -----------------------------------------------------------------

    @property
    def latest(self) -> Snapshot | None:
        """The snapshot of the last finished step (built now if newer steps finished since)."""
        if self._dirty:
            self._build()
        return self._latest

    def _build(self, oom: str | None = None) -> Snapshot | None:
        rec = self._last_rec
        if rec is None and oom is None:
            return self._latest
        try:
            result = self._memory_result(rec) if rec is not None else None
            timing_rec, self._timing_rec = self._timing_rec, None
            if timing_rec is not None:
                durations = timing_rec[1].durations()
                if durations is not None:
                    self._set_timing(timing_rec[0], durations)
            snap = self._snapshot(result, oom)
        except Exception as exc:
            self._fail("snapshot", exc)
            return self._latest
        if oom is None:
            self._latest = snap
            self._dirty = False
            self._last_built = time.monotonic()
            self.history.append(snap)
        return snap

    def _snapshot(self, result: dict[str, Any] | None, oom: str | None) -> Snapshot:
        precision = self.precision
        kind = self.optimizer_kind
        cached = self._expected
        if cached is None or cached[0] != (precision, kind):
            table = {c.value: expected_bytes_per_param(c, precision, kind) for c in MODEL_COMPONENTS}
            cached = self._expected = ((precision, kind), table)
        expected = dict(cached[1])
        if result is None:
            memory: dict[str, int | None] = dict(_NO_MEMORY)
            memory[Component.WEIGHTS.value] = self._weights if self.enabled else None
            result = {
                "step": self._steps_done,
                "memory": memory,
                "peak": None,
                "phase": None,
                "source": "none",
                "cuda": None,
                "micro": 0,
            }
        achieved, mfu = self._throughput()
        self._seq += 1
        snap = Snapshot(
            pid=os.getpid(),
            seq=self._seq,
            time=time.time(),
            step=int(result["step"]),
            memory=dict(result["memory"]),
            expected_bytes_per_param=expected,
            parameter_count=self._param_count if self.enabled else 0,
            peak_bytes=result["peak"],
            peak_phase=result["phase"],
            memory_source=result["source"],
            cuda=result["cuda"],
            timing=self._timing,
            op_groups=dict(self._op_groups) if self._op_groups is not None else None,
            op_groups_step=self._op_groups_step,
            achieved_tflops=achieved,
            mfu=mfu,
            grad_accum_steps=max(int(result["micro"]), 1) if result["micro"] else self.grad_accum_steps,
            error=self.error,
            oom=oom[:_MAX_TEXT] if oom is not None else None,
            batch_size=result.get("batch"),
            at_peak=result.get("at_peak"),
            at_peak_step=result.get("at_peak_step"),
            memory_in_use=self._in_use_now(self._last_rec),
        )
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

    def _in_use_now(self, rec: _Step | None) -> int | None:
        """Memory in use at the step's end: its last reading, so no extra read (mallinfo2 walks the
        heap's arenas: ~0.1 ms on a fragmented heap); on CPU, a step that did not read the heap
        reports the last reading of the last step that read it."""
        if rec is None or not self.enabled:
            return None
        if self._cuda:
            end = rec.cuda_end
            return int(end.allocated) if end is not None else None
        return rec.heap_samples[-1][1] if rec.heap_samples else rec.heap0

    def _advise(self, snap: Snapshot) -> list[Suggestion]:
        if not self._ok("advisor"):
            return []
        advise = _load("advisor", "advise")
        if advise is None:
            return []
        try:
            out = advise(self.hello, snap, tuple(self.history), None)
            return [s for s in out if isinstance(s, Suggestion)][:64]
        except Exception as exc:
            self._fail("advisor", exc)
            return []

    def _publisher_ready(self) -> Any:
        if self._publisher is not None or self._publisher_tried or not self._publish:
            return self._publisher
        self._publisher_tried = True
        publisher_cls = _load("publisher", "Publisher")
        if publisher_cls is None:
            self._errors.setdefault("publish", "publish: anatomy.publisher is not available")
            return None
        try:
            pub = publisher_cls(self.hello, interval_s=self.interval_s, directory=self._directory)
            if pub.start() is None:
                self._errors.setdefault("publish", "publish: the socket could not be opened")
                return None
            self._publisher = pub
        except Exception as exc:
            self._fail("publish", exc)
        return self._publisher

    def _publish_now(self) -> None:
        snap = self._build()
        if snap is None or not self._publish or not self._ok("publish"):
            return
        pub = self._publisher_ready()
        if pub is None:
            return
        try:
            pub.publish(snap)
        except Exception as exc:
            self._fail("publish", exc)

    def _write_oom(self, exc: BaseException) -> Path | None:
        """The last snapshot, with the error text, to the OOM file. Never raises."""
        # By id: holding the exception would keep its traceback's frames (and tensors) alive.
        if not self._publish or id(exc) == self._oom_recorded:
            return self._oom_path  # already written for this exception (step, then tracker, exit)
        self._oom_recorded = id(exc)
        try:
            text = f"{type(exc).__name__}: {exc}"
            snap = self._build(oom=text)
            if snap is None:
                return None
            pub = self._publisher_ready()
            if pub is not None:
                self._oom_path = pub.write_oom(snap)
            else:
                directory = self._directory or protocol.runtime_dir(create=True)
                self._oom_path = protocol.write_oom_file(Path(directory), self.hello, snap)
            return self._oom_path
        except Exception as err:
            self._fail("oom", err)
            return None

    def record_oom(self, exc: BaseException) -> Path | None:
        """For wrappers that catch an exception outside a step (the Trainer callback): if it is an
        out-of-memory error, end the step in progress and write the OOM file."""
        if not self.enabled or not is_oom(exc):
            return None
        rec = self._step
        if rec is not None:
            self._step = None
            try:
                self._counter.stop()
                self._finish(rec, exc)
            except Exception as err:
                self._fail("step", err)
        return self._write_oom(exc)

    # -- life cycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Detach every hook, publish the last snapshot and remove the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        if self._step is not None:
            self.end_step()
        for h in self._handles + self._opt_handles:
            try:
                h.remove()
            except Exception as exc:
                log.debug("anatomy: removing a hook: %s", exc)
        self._handles, self._opt_handles = [], []
        try:
            self._counter.stop()
        except Exception as exc:
            self._fail("activations", exc)
        if self._dirty:
            self._publish_now()
        pub, self._publisher = self._publisher, None
        if pub is not None:
            try:
                pub.close()
            except Exception as exc:
                self._fail("publish", exc)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def socket_path(self) -> Path | None:
        pub = self._publisher
        return getattr(pub, "path", None) if pub is not None else None

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
) -> Tracker:
    """Attach the anatomy hook to ``model`` (and ``optimizer``). With ``ANATOMY_TOP=0`` in the
    environment this returns a tracker that does nothing (same API)."""
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
    )
