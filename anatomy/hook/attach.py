"""The tracker's set-up and what it detects: the model and the optimizers it is attached to and their
hooks, the exact sums over their tensors, the device and its memory backend, the precision, the
optimizer's kind, the hello and the guide's bytes per parameter.

The lowest layer of :class:`~anatomy.hook.tracker.Tracker` (see :mod:`anatomy.hook.tracker_state`).
None of it runs on an ordinary step but :meth:`Attachment._model_changed`'s cheap look.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from anatomy.hook import zero as zero_opt
from anatomy.hook.backend import CudaBackend, HeapBackend
from anatomy.hook.changes import ModelWatch, OptimizerWatch
from anatomy.hook.compiled import compile_in_use, outside_compile
from anatomy.hook.cuda import CudaAllocator
from anatomy.hook.detect import detect_optimizer, detect_precision
from anatomy.hook.distributed import Buckets
from anatomy.hook.guard import Feature
from anatomy.hook.heap import HostHeap
from anatomy.hook.hello import build_hello
from anatomy.hook.paged import paged_state_bytes
from anatomy.hook.quantized import weight_quantization
from anatomy.hook.record import StepRecord, Sums
from anatomy.hook.saved import SavedTensorCounter
from anatomy.hook.schedule import LOOK
from anatomy.hook.tensors import (
    dominant_dtype,
    gradient_bytes,
    model_parts,
    optimizer_state_bytes,
    parameter_count,
    storage_key,
    unwrap_optimizer,
    weight_bytes,
)
from anatomy.hook.tracker_state import TrackerState
from anatomy.protocol import Hello
from anatomy.vocabulary import MODEL_COMPONENTS, Component, OptimizerKind, Precision, expected_bytes_per_param


class Attachment(TrackerState):
    """What the tracker is attached to, its exact sums, and what it detects."""

    def _setup(self, model: torch.nn.Module, optimizer: Any) -> None:
        self._counter = SavedTensorCounter()
        self._probe_ref = None
        self._witness_ref = None
        self._probe_ptr = 0
        self._probe_data = None
        self._model_watch = ModelWatch(model)
        self._model_watch.on_suspect = self._gate.close  # (a registration on the model: the next step looks)
        self._optimizer_watch = OptimizerWatch(
            self.attach_optimizer, lambda exc: self._guard.fail(Feature.OPTIMIZER, exc)
        )
        self._refresh_weights()
        self._sums.gradients = gradient_bytes(model)
        self._register_model_hooks()
        if self._compile_safe:
            self._optimizer_watch.keep_out(outside_compile)
        self.attach_optimizer(optimizer)

    @property
    def _optimizer(self) -> Any:
        ref = self._optimizer_ref
        return ref() if ref is not None else None

    def _register_model_hooks(self) -> None:
        """The forward pre/post hooks, kept out of compiled graphs once anything is compiled."""
        for h in self._handles:
            h.remove()
        self._resting = False
        self._gate.close()  # (until a step ends in full with these hooks: compiled now, perhaps)
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
        stepped = []  # the optimizers whose step pre-hook is the optimizer watch's global one
        for i, each in enumerate(self._optimizers()):
            if i == 0 and zero is not None:  # its torch optimizer steps once per group: hook the update
                self._opt_handles += list(zero_opt.hook_step(zero, pre, post))
            elif hasattr(each, "register_step_pre_hook") and hasattr(each, "register_step_post_hook"):
                if isinstance(each, torch.optim.Optimizer):  # (torch calls the global pre-hooks for it)
                    stepped.append(each)
                else:
                    self._opt_handles.append(each.register_step_pre_hook(pre))
                self._opt_handles.append(each.register_step_post_hook(post))
        self._optimizer_watch.step_through(stepped, self._on_optimizer_pre if stepped else None)

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
            self._optimizer_watch.keep_out(outside_compile)

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
            self._gate.close()

    def set_precision(self, precision: Precision | None = None, *, grad_scaler: bool | None = None) -> None:
        """Tell the tracker what it cannot see (e.g. the Trainer's fp16/bf16 flags)."""
        if precision is not None:
            self._precision_override = precision
        if grad_scaler is not None:
            self._grad_scaler = grad_scaler
        self._hello_changed()

    def _hello_changed(self) -> None:
        """Rebuilt on next use; a running publisher gets it with the next snapshot."""
        self._gate.close()  # (a resting step ends as the last build: not with a set-up changed)
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
        parts = model_parts(model)  # (each walk once: a re-sum asks for each several times)
        params, buffers, modules = parts
        by_dtype = weight_bytes(model, parts)
        self._sums.weights_by_dtype = by_dtype
        self._sums.weights = sum(by_dtype.values())
        weights = [*params, *buffers]
        self._counter.set_params(weights)
        if self._guard.ok(Feature.CHANGES):
            with self._guard(Feature.CHANGES):
                self._model_watch.remember(modules, params)
                self._optimizer_watch.set_params(params)
        candidates = [p for p in params if p.requires_grad] or params
        probe = candidates[0] if candidates else None
        before = self._probe_ref() if self._probe_ref is not None else None
        self._probe_ref = weakref.ref(probe) if probe is not None else None
        if probe is not before:  # (the same probe keeps the witness a look learned for it)
            self._witness_ref = self._probe_ref
        self._probe_ptr = storage_key(probe) if probe is not None else 0
        # A plain parameter's own data pointer moves with its storage, and reading it allocates nothing.
        plain = probe is not None and type(probe) in (torch.nn.Parameter, torch.Tensor)
        self._probe_data = probe.data_ptr() if plain and probe is not None else None
        count, dtype = parameter_count(params), dominant_dtype(params)
        trainable = parameter_count(params, trainable=True)
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
            self._schedule.charge(LOOK, time.perf_counter() - began, index)
            return changed
        except Exception as exc:
            self._guard.fail(Feature.CHANGES, exc)
        return False

    def _use_device(self, device: torch.device) -> None:
        """Measure on this device: the caching allocator's statistics on CUDA, else glibc's heap (or the
        backend the constructor's factory makes)."""
        self._device = device
        self._counter.device = device  # a saved tensor offloaded elsewhere holds none of its memory
        self._cuda_events = device.type == "cuda"
        self._hello_changed()
        # A fresh backend: a trace of another device's memory says nothing about this one.
        if self._backend_factory is not None:
            self._memory = self._backend_factory(device, self._guard)
            return
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
    def sums(self) -> Sums:
        """A copy of the last exact sums over the model's and the optimizers' tensors and the last
        activation count (changing it changes nothing here)."""
        sums = self._sums
        by_dtype, others = dict(sums.weights_by_dtype), dict(sums.other_by_name)
        return replace(sums, weights_by_dtype=by_dtype, other_by_name=others)

    @property
    def activation_counter(self) -> SavedTensorCounter:
        """The saved-tensor counter, for its figures (``activation_bytes``, ``track_alive``,
        ``alive_activation_bytes``...): reading it changes nothing."""
        return self._counter

    @property
    def _is_cuda(self) -> bool:
        return self._memory is not None and self._memory.is_cuda

    # -- set-up as detected ------------------------------------------------------------------------

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
                target_shape=self._target_shape,
            )
        return self._hello

    def _expected_bytes(self, precision: Precision) -> dict[Component, float | None]:
        """The guide's bytes per parameter for this set-up (``precision``: :attr:`precision`, as read)."""
        kind = self.optimizer_kind
        total, trainable = self._param_count, self._trainable_count
        fraction = round(trainable / total, 6) if total > 0 else 1.0
        quantized = self._quantization is not None
        cached = self._expected
        if cached is None or cached[0] != (precision, kind, fraction, quantized):
            table = {
                c: expected_bytes_per_param(c, precision, kind, fraction, quantized)
                for c in MODEL_COMPONENTS
            }
            cached = self._expected = ((precision, kind, fraction, quantized), table)
        zero = self._zero
        if zero is not None:  # laid out as DeepSpeed lays it out (masters with the optimizer states)
            itemsize = torch.empty(0, dtype=self._param_dtype).element_size()
            return zero_opt.expected(cached[1], zero, itemsize)
        return dict(cached[1])
