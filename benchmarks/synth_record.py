"""A recorded run made without training: synthetic snapshots written by the real recorder (the same
writer, the same thinning), for the report's tests and benchmarks. Stdlib only.

The run: a model whose activations creep up, a set-up change (the optimizer swapped) at 40 % of the
steps, op groups and MFU on sampled steps, suggestions, and optionally an OOM at the end; one snapshot
recorded per ``steps_per_tick`` steps (the publisher's interval), every step's row.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from anatomy.protocol import CudaMemory, Hello, OpGroupStat, Snapshot, Suggestion, Timing
from anatomy.recorder import Recorder
from anatomy.vocabulary import Component, OpGroup

GIB = 1 << 30


def hello(
    pid: int, t0: float, *, rank: int | None = None, world: int | None = None, optimizer: str = "adamw"
) -> Hello:
    return Hello(
        pid=pid,
        host="node-7",
        device=f"cuda:{rank or 0}",
        precision="bf16_mixed",
        optimizer=optimizer,
        model_class="LlamaForCausalLM",
        parameter_count=1_100_000_000,
        torch_version="2.9.0",
        started_at=t0 + (rank or 0) * 0.5,
        rank=rank,
        local_rank=rank,
        world_size=world,
        device_name="NVIDIA H100 80GB HBM3",
        device_memory_bytes=80 * GIB,
        run_id="job42" if world else None,
        local_world_size=world,
    )


def snapshot(
    pid: int, t0: float, step: int, steps: int, *, slow: float = 1.0, oom: str | None = None
) -> Snapshot:
    creep = step / max(steps, 1)
    acts = int((6 + 3 * creep + 0.3 * math.sin(step / 50)) * GIB)
    memory: dict[str, int | None] = {
        Component.CUDA_CONTEXT.value: int(0.6 * GIB),
        Component.ALLOCATOR_CACHE.value: int((1 + 4 * creep) * GIB),
        Component.WEIGHTS.value: int(2.2 * GIB),
        Component.OPTIMIZER_STATES.value: int(8.8 * GIB),
        Component.GRADIENTS.value: int(2.2 * GIB),
        Component.ACTIVATIONS.value: acts,
        Component.TEMPORARIES.value: int(1.5 * GIB),
        Component.UNATTRIBUTED.value: int(0.1 * GIB),
    }
    model = {k: v for k, v in memory.items() if k not in ("cuda_context", "allocator_cache")}
    peak = sum(v or 0 for v in model.values())
    step_s = (0.42 + 0.05 * math.sin(step / 30) + 0.1 * creep) * slow
    groups = {
        OpGroup.CONTRACTION.value: OpGroupStat(flops=4e15, time_s=step_s * 0.55),
        OpGroup.NORMALIZATION.value: OpGroupStat(flops=1e12, time_s=step_s * 0.12),
        OpGroup.ELEMENTWISE.value: OpGroupStat(flops=2e12, time_s=step_s * (0.2 - 0.05 * creep)),
        OpGroup.OPTIMIZER.value: OpGroupStat(flops=1e11, time_s=step_s * 0.08),
        OpGroup.OTHER.value: OpGroupStat(flops=None, time_s=step_s * (0.05 + 0.05 * creep)),
    }
    return Snapshot(
        pid=pid,
        seq=step + 1,
        time=t0 + 1.0 + step * 0.45 * slow,
        step=step,
        memory=memory,
        expected_bytes_per_param={Component.WEIGHTS.value: 2.0},
        parameter_count=1_100_000_000,
        peak_bytes=peak,
        peak_phase="backward",
        memory_source="cuda_allocator",
        cuda=CudaMemory(allocated=peak, reserved=peak + GIB, peak_allocated=peak, alloc_retries=0, ooms=0),
        timing=Timing(
            step_s=step_s,
            forward_s=step_s * 0.3,
            backward_s=step_s * 0.6,
            optimizer_s=step_s * 0.08,
            samples_per_s=8 / step_s,
            tokens_per_s=8 * 2048 / step_s,
        ),
        op_groups=groups,
        op_groups_step=step - step % 100,
        achieved_tflops=180.0 / slow,
        mfu=0.38 / slow - 0.05 * creep,
        suggestions=[
            Suggestion(
                rule="activation_checkpointing",
                title="Activation checkpointing",
                detail="Recompute activations in backward instead of keeping them.",
                source="guide",
                saving_bytes=int(5 * GIB),
                speed_factor=1.3,
            )
        ],
        oom=oom,
        batch_size=8,
        at_peak=model,
        at_peak_step=step,
    )


def synthesize(
    directory: Path,
    steps: int,
    *,
    pid: int = 4242,
    rank: int | None = None,
    world: int | None = None,
    oom: bool = False,
    slow: float = 1.0,
    steps_per_tick: int = 5,
    max_bytes: int | None = None,
) -> Path:
    """Record a synthetic run of ``steps`` steps into ``directory``; its record file."""
    kw = {"max_bytes": max_bytes} if max_bytes else {}
    recorder = Recorder(directory, snapshot_interval_s=0.0, **kw)
    t0 = time.time() - 2.0 - steps * 0.45 * slow  # as if it had just finished
    h = hello(pid, t0, rank=rank, world=world)
    change = int(steps * 0.4)
    for start in range(0, steps, steps_per_tick):
        if start >= change and h.optimizer == "adamw":
            h = hello(pid, t0, rank=rank, world=world, optimizer="adafactor")
        batch = [
            snapshot(pid, t0, s, steps, slow=slow) for s in range(start, min(start + steps_per_tick, steps))
        ]
        recorder.tick(h, batch)
    if oom:
        text = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
        last = snapshot(pid, t0, steps, steps, slow=slow, oom=text)
        recorder.tick(h, [last])
    recorder.close(h, [])
    assert recorder.path is not None and not recorder.off
    return recorder.path
