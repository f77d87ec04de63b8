"""The state of one tracker, declared once for the layers its class is built from.

:class:`~anatomy.hook.tracker.Tracker` is one object built in layers, each in its own module and each
using the ones below it: the set-up and what it detects (:mod:`anatomy.hook.attach`), the sampled
step's instruments (:mod:`anatomy.hook.sampled`), the saved-tensor count's window
(:mod:`anatomy.hook.window`), the phase hooks (:mod:`anatomy.hook.phases`), a framework's calls
(:mod:`anatomy.hook.framework`), the finished step's snapshot
and publishing (:mod:`anatomy.hook.snapshots`, which hands the figures to the pure
:mod:`anatomy.hook.assembly`), a step's beginning and end — the full end, and an ordinary step's O(1) one
on a :mod:`anatomy.hook.lean` step (:mod:`anatomy.hook.ordinary`) — and the step's life cycle
(:mod:`anatomy.hook.tracker`). The layers share this state directly rather than through objects of their
own because the hooks run on every training step, where an attribute hop per read is what the per-step
budget cannot spare.
``Tracker.__init__`` sets every attribute.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from anatomy.hook.backend import BackendFactory, MemoryBackend
from anatomy.hook.changes import ModelWatch, OptimizerWatch
from anatomy.hook.compiled import CompileProbe
from anatomy.hook.guard import Guard
from anatomy.hook.heap import HostHeap
from anatomy.hook.lean import LeanStep
from anatomy.hook.others import OtherModels
from anatomy.hook.pieces import PiecePlan
from anatomy.hook.publishing import Channel
from anatomy.hook.record import StepRecord, Sums, Traced
from anatomy.hook.rest_gate import RestGate, StepCount
from anatomy.hook.saved import SavedTensorCounter
from anatomy.hook.schedule import Schedule
from anatomy.hook.throughput import Throughput
from anatomy.hook.timing import ClockFactory, ClockRing
from anatomy.protocol import Hello, Snapshot, Suggestion
from anatomy.step_feed import FeedHistory, StepFeed
from anatomy.vocabulary import Component, OptimizerKind, Precision


class TrackerState:
    """Attribute declarations only: each layer reads and writes these on the one tracker object."""

    enabled: bool
    model: torch.nn.Module
    interval_s: float
    grad_accum_steps: int
    history: FeedHistory  # the last steps' snapshots, made from the feed when read
    _feed: StepFeed  # every finished step's numbers (the training thread writes, other threads read)
    _guard: Guard
    _schedule: Schedule
    _throughput: Throughput
    _channel: Channel
    _sums: Sums
    # -- the set-up (anatomy.hook.attach)
    _precision_override: Precision | None
    _optimizer_ref: weakref.ref[Any] | None  # weak: a replaced optimizer must die
    _zero_ref: weakref.ref[Any] | None  # DeepSpeed's ZeRO optimizer around it, if any
    _zero_grads_begin: int  # its gradient buffers at the last measured step's start (stage 3's stay)
    _managed: int  # paged optimizer states in CUDA managed memory (anatomy.hook.paged)
    _extra_optimizers: list[weakref.ref[Any]]  # further optimizers stepped in the same step (a GAN's)
    _kind_of: tuple[Any, OptimizerKind] | None
    _hello: Hello | None
    _hello_stale: bool  # the hello changed since the publisher last got it
    _opt_handles: list[Any]
    _handles: list[Any]
    _started_at: float
    _expected: tuple[tuple[Precision, OptimizerKind, float, bool], dict[Component, float | None]] | None
    _autocast_dtype: torch.dtype | None
    _grad_scaler: bool
    _device: torch.device | None
    _cuda_events: bool  # phase times from CUDA events, else the host clock
    _step_clock: ClockFactory  # a step's clock (StepClock, unless the constructor was given another)
    _backend_factory: BackendFactory | None  # the memory backend per device, if given (else built in)
    _heap: HostHeap | None
    _memory: MemoryBackend | None
    _param_count: int
    _param_dtype: torch.dtype
    _trainable_count: int
    _quantization: str | None
    _others: OtherModels
    _compile_safe: bool  # the hooks are wrapped to run outside compiled frames
    _compiled: CompileProbe  # has anything been compiled since (asked every step)
    _counter: SavedTensorCounter
    _probe_ref: weakref.ref[torch.Tensor] | None  # one parameter, watched every step
    # The tensor whose version counter an update moves (anatomy.hook.resting): the probe parameter, or where
    # a fused optimizer's kernel moves no parameter's, its step count in the optimizer's state (a tensor;
    # a Python int: rest_gate.StepCount, read as a version is).
    _witness_ref: weakref.ref[torch.Tensor] | StepCount | None
    _probe_ptr: int
    _probe_data: int | None
    _model_watch: ModelWatch
    _optimizer_watch: OptimizerWatch
    # -- the steps (anatomy.hook.phases, anatomy.hook.tracker)
    _step: StepRecord | None  # the step in progress
    _finished: StepRecord | None  # the last finished step (rebuild() and an OOM record start from it)
    _finished_lean: bool  # the last finished step ended lean: its record is made from its LeanStep on demand
    _lean: LeanStep  # the ordinary step in progress (``active``), or the last one
    _lean_other: LeanStep  # the one before it (the two alternate: a finished one stays readable)
    _explicit: bool  # steps are marked (tracker.step / begin_step), not begun by a forward
    _unseen_updates: int  # optimizer updates with no step around them (a forward never seen)
    _closed: bool
    _steps_done: int
    _forced_refresh: int  # a step whose sums are re-taken whatever the schedule (a change)
    _quiet_until: int  # steps before this one are ordinary (Schedule.quiet_until)
    _looked_at: int  # the last step that compared the model's parameters in full
    _batch_shape: tuple[int, ...] | None  # the first batch tensor's, for `plan --like`
    _target_shape: tuple[int, ...] | None  # the first batch's labels', likewise
    _plain_ok: bool  # the next ordinary step may begin and end in O(1) (StepRecord.plain)
    _lean_on_device: bool  # ordinary steps are timed by CUDA events (some of them: _device_due)
    _device_due: float  # perf_counter time from which the next ordinary step records its CUDA events
    _clock_ring: ClockRing  # their clocks, made once and used again
    _lean_check: Callable[[], bool] | None  # an ordinary step's one allocator read, at its end (CUDA)
    # Whether an ordinary step may run with every hook of ours off (``ok``: anatomy.hook.lean's REST
    # flags: never, or where it is given its samples, its tokens), as of the last step ended in full, and what
    # a resting step reads (anatomy.hook.resting).
    _gate: RestGate
    _resting: bool  # the model's forward hooks are off now (between looks)
    _no_rest: bool  # a framework marks every forward (no batch_begins first): the hooks never rest
    _framework_rests: bool  # the framework leaves its calls out of resting steps (batch_begins)
    # -- sampled steps (anatomy.hook.sampled)
    _episode: list[str]  # the instruments still to run in the sampled episode in progress, in order
    _plan: PiecePlan | None  # the pieces of the instrument running, in a stack of blocks
    _blocks: list[torch.nn.Module]  # the model's repeated blocks, as the episode began (none: whole steps)
    _per_piece: dict[str, int]  # blocks per piece, per instrument, as the last piece's cost sized it
    _traced_best: Traced | None  # the highest of the trace's pieces so far
    _fastest_piece_s: float  # the quickest step that ran a piece (stands for a usual one until one is timed)
    _spare: StepRecord | None  # a record that ended plain, no longer the last finished: reused by a promotion
    # -- snapshots and publishing (anatomy.hook.snapshots)
    _seq: int
    _latest: Snapshot | None  # the last snapshot built in full (an ordinary step's repeats it)
    _last_built: float  # when (perf_counter)
    _rebuild_after_s: float  # an ordinary step is built in full all the same once the last build is this old
    _built_stamp: tuple[Any, ...] | None  # the stamp of the last step built in full
    _built_errors: int  # the guard's version then
    # What an ordinary step must share with the last build to be it repeated (Tracker._end_plain):
    _base_micro: int  # its micro-batches (-1: no step built)
    _base_samples: int | None  # its samples (given, or counted)
    _base_grads_begin: int  # its gradients at the start
    _base_peak: float  # its peak (NaN: none), for the recorder's rows
    _balance_logged: bool  # the named tensors exceeded a peak: said once
    _suggestions: list[Suggestion]
    _advised_at: float
    _oom_recorded: int | None
    _oom_path: Path | None

    if TYPE_CHECKING:  # what a layer calls of a layer above it (defined there)

        def _on_forward_pre(
            self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> None: ...
        def _on_forward_post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None: ...
        def _on_optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> tuple[Any, Any] | None: ...
        def _on_optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None: ...
        def begin_step(self, samples: int | None = None, tokens: int | None = None) -> None: ...
        def _begin(self, auto: bool, samples: int | None = None, tokens: int | None = None) -> None: ...
        def end_step(self, exc: BaseException | None = None) -> None: ...
        def _promote(self) -> StepRecord: ...
        def _last_record(self) -> StepRecord | None: ...
        def _rest_allow(self, rec: StepRecord) -> None: ...
        def _hooks_on(self) -> None: ...
