"""The GPU check's resting runs: a launch-bound MLP (a step of a few milliseconds, most of it Python launching
kernels) trained twice on ``cuda:0`` with the hook — every step built the full way, then as shipped, where an
ordinary step told its samples rests (no hook of ours between its begin and its end, one allocator read at
its end) between the steps the device times — once with a micro-batch a step, once with four micro-batches a
step in blocks of their own (gradient accumulation, as accelerate's ``accumulate`` tells them; the user resets
the allocator's peak before each step there, once at the start in the other). Each pair must
publish the same history field for field (the real caching allocator's readings, the peak and its phase,
every memory row), train bit-identically and leave the user's ``max_memory_allocated()`` reading the same;
and most step blocks must have rested, or the pair compared the full way with itself."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch

import anatomy
from anatomy.gpucheck.verdicts import Verdict, failed_workload, losses, rested, resting_same
from anatomy.gpucheck.workloads import release
from anatomy.hook import ordinary, resting
from anatomy.vocabulary import Component

STEPS = 60  # one micro-batch a step (the tracker's history holds the last 120)
ACCUMULATED_STEPS = 25  # four blocks a step
BLOCKS = 4
WARMUP_STEPS = 3  # an unmeasured run first, as check_workload's (the libraries' workspaces)
DEPTH, WIDTH, BATCH = 8, 256, 32
CHECKS = ("losses resting = every step built", "resting steps = every step built", "ordinary steps rested")
# What differs between two runs of the same steps by its nature: when, how long, and what follows from times.
_PER_RUN = ("seq", "time", "timing", "suggestions", "achieved_tflops", "mfu")
# On the host the peak is the process's heap, which moves with whatever else the process allocates.
_HOST_ONLY = ("peak_bytes", "peak_phase", "at_peak")
_TENSOR_SUMS = (Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES, Component.ACTIVATIONS)


@dataclass
class RestRun:
    history: list[dict[str, Any]]
    losses: list[float]
    user_peaks: list[int]  # max_memory_allocated after each step (on CUDA)
    rested: int  # step blocks that began resting
    blocks: int  # step blocks run
    step_s: float  # the run's mean step, device work included (one synchronization, at its end)


def _model(dev: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(dev)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _fields(snap: Any, on_cuda: bool) -> dict[str, Any]:
    fields = {k: v for k, v in dataclasses.asdict(snap).items() if k not in _PER_RUN}
    if not on_cuda:  # (the rows derived from the heap: there or not)
        for k in _HOST_ONLY:
            fields.pop(k, None)
        fields["memory"] = {c: v if c in _TENSOR_SUMS else v is not None for c, v in snap.memory.items()}
    return fields


def run(rest: bool, blocks: int, steps: int, dev: torch.device, reset_each_step: bool = False) -> RestRun:
    """``steps`` steps of ``blocks`` blocks each, told their samples; ``rest`` False: every step built. The
    user resets the allocator's peak as the run starts (else it is an earlier run's high, which no step of
    this one moves), or before each step (``reset_each_step``, as the Trainer's memory metrics do)."""
    on_cuda = dev.type == "cuda"
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    saved = resting.REST_ON, ordinary.ORDINARY_IN_O1
    resting.REST_ON = ordinary.ORDINARY_IN_O1 = rest
    model, opt = _model(dev)
    x = torch.randn(BATCH, WIDTH, device=dev)
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    counts = [0, 0]  # step blocks that rested, step blocks begun
    begin = tracker._rest_begin

    def counted(samples: int | None, tokens: int | None) -> bool:
        ok = begin(samples, tokens)
        counts[0] += ok
        return ok

    tracker._rest_begin = counted  # type: ignore[method-assign]  # (this tracker's alone)
    kept: list[torch.Tensor] = []
    peaks: list[int] = []
    sync = torch.cuda.synchronize if on_cuda else (lambda: None)
    try:
        sync()
        began = time.perf_counter()
        for _ in range(steps):
            if on_cuda and reset_each_step:
                torch.cuda.reset_peak_memory_stats(dev)
            for b in range(blocks):
                counts[1] += 1
                with tracker.step(samples=BATCH):
                    loss = model(x).square().mean()
                    loss.backward()
                    if b == blocks - 1:
                        opt.step()
                        opt.zero_grad(set_to_none=True)
            kept.append(loss.detach())  # (read after the run: no synchronization between steps)
            if on_cuda:
                peaks.append(int(torch.cuda.max_memory_allocated(dev)))
        sync()
        step_s = (time.perf_counter() - began) / steps
        history = [_fields(s, on_cuda) for s in tracker.history]
    finally:
        tracker.close()
        resting.REST_ON, ordinary.ORDINARY_IN_O1 = saved
    return RestRun(history, [float(t) for t in kept], peaks, counts[0], counts[1], step_s)


def check_resting(device: torch.device | None = None) -> list[Verdict]:
    """Both pairs' verdicts; ``device`` is ``cuda:0`` unless a test runs them elsewhere."""
    dev = device if device is not None else torch.device("cuda", 0)
    out: list[Verdict] = []
    pairs = (("mlp-resting", 1, STEPS, False), ("mlp-accumulate-4", BLOCKS, ACCUMULATED_STEPS, True))
    for name, blocks, steps, reset in pairs:
        try:
            run(False, blocks, WARMUP_STEPS, dev)
            release()
            full = run(False, blocks, steps, dev, reset)
            release()
            rest = run(True, blocks, steps, dev, reset)
            release()
        except Exception as exc:
            out += failed_workload(name, CHECKS, exc)
            continue
        out.append(
            dataclasses.replace(losses(name, full.losses, rest.losses, tolerance=0.0), check=CHECKS[0])
        )
        out.append(resting_same(name, full.history, rest.history, full.user_peaks, rest.user_peaks))
        out.append(rested(name, rest.rested, rest.blocks, (rest.step_s, full.step_s)))
    return out
