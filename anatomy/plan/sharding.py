"""One rank of a sharded or replicated job: FSDP2, DDP and DeepSpeed ZeRO, from the single-device plan.

The fake step (activations, temporaries, the phases' peaks and what is live at each) does not change
with data parallelism: every rank runs the whole model on its own micro-batch. What changes is what
each rank keeps of the model states, and the communication buffers. Those are arithmetic on the
model's parameter shapes, following each implementation's allocations (torch 2.13, DeepSpeed 0.19):

* **FSDP2** (``fully_shard`` on every transformer block — the classes in the model's
  ``_no_split_modules``, as accelerate's and torchtitan's wrap policies pick them — and on the root):
  each parameter is chunked on dim 0 into N chunks of ceil(dim0 / N) rows, the shard padded to that
  size (``FSDPParam._init_sharded_param``); rank 0 holds the largest chunk, so the plan is rank 0's.
  Gradients are one flat reduce-scatter output per group (``foreach_reduce``), the same padded size.
  AdamW's states are ``zeros_like`` of the local shard. The root's parameters stay all-gathered from
  its forward through backward (the root does not reshard after forward); a block's parameters are
  all-gathered (N x the padded shard) while it runs; a block's gradients are reduce-scattered through
  a copy of its padded unsharded gradients.
* **DDP**: every rank holds the whole model; the reducer's buckets are a second copy of the gradients,
  assigned over the parameters in reverse order, the first bucket capped at 1 MiB
  (``dist._DEFAULT_FIRST_BUCKET_BYTES``) and the others at 25 MiB (``bucket_cap_mb``), one set per dtype.
* **ZeRO** (DeepSpeed): parameters are flattened and padded to a multiple of 2 x N elements
  (``nccl_start_alignment_factor``); each rank keeps 1/N of the fp32 master weights and Adam moments
  (stage >= 1), of the gradients (stage >= 2), of the low-precision parameters (stage 3, which gathers
  the largest layer's parameters and gradients for its forward and backward) — the arithmetic of the
  ZeRO paper and of DeepSpeed's ``estimate_zero{2,3}_model_states_mem_needs``.

A phase's peak on a rank is the single-device peak of that phase with the full parameters and
gradients live at it replaced by what the rank holds then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from anatomy.plan.settings import PlanSettings, Target
from anatomy.plan.states import ParamShape, allocation_bytes, optimizer_state_bytes
from anatomy.vocabulary import Component, Phase

MIB = 1 << 20
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_CAP_BYTES = 25 * MIB  # DistributedDataParallel(bucket_cap_mb=25)
ZERO_ALIGNMENT = 2  # DeepSpeed's nccl_start_alignment_factor: partitions padded to 2 x world elements
ZERO_REDUCE_BUCKET = 500_000_000  # DeepSpeed's default reduce_bucket_size (elements)


@dataclass(frozen=True)
class Layout:
    """The trainable parameters by FSDP unit: ``groups[0]`` the root's, then one per block."""

    groups: tuple[tuple[ParamShape, ...], ...]
    buffer_bytes: int
    block_class: str | None
    largest_module: int = 0  # elements of the module with the most parameters of its own (ZeRO-3 gathers it)

    @property
    def shapes(self) -> tuple[ParamShape, ...]:
        return tuple(s for g in self.groups for s in g)


def layout_of(model: Any, buffer_bytes: int) -> Layout:
    """The root's parameters and each block's, in module order (the meta-device model)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    # A block inside another block (none in transformers' lists, but be safe) belongs to the outer one.
    inner = {id(sub) for b in blocks for sub in b.modules() if sub is not b}
    blocks = [b for b in blocks if id(b) not in inner]
    seen: set[int] = set()
    groups: list[tuple[ParamShape, ...]] = []
    for block in blocks:
        shapes = []
        for p in block.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                shapes.append(ParamShape(tuple(p.shape), p.element_size()))
        groups.append(tuple(shapes))
    root = tuple(
        ParamShape(tuple(p.shape), p.element_size())
        for p in model.parameters()
        if p.requires_grad and id(p) not in seen
    )
    block_class = type(blocks[0]).__name__ if blocks else None
    largest = max(
        (sum(p.numel() for p in m.parameters(recurse=False) if p.requires_grad) for m in model.modules()),
        default=0,
    )
    return Layout((root, *groups), buffer_bytes, block_class, largest)


def shard_shape(shape: ParamShape, n: int) -> ParamShape:
    """Rank 0's padded FSDP2 shard: ceil(dim0 / N) rows (0-dim tensors are kept whole)."""
    if not shape.shape:
        return shape
    return ParamShape((-(-shape.shape[0] // n), *shape.shape[1:]), shape.element_size)


def gathered_bytes(shapes: tuple[ParamShape, ...], n: int) -> int:
    """An all-gather's (or reduce-scatter input's) bytes: N padded shards of every parameter."""
    return sum(n * shard_shape(s, n).nbytes for s in shapes)


def ddp_buckets(shapes: tuple[ParamShape, ...]) -> list[int]:
    """DDP's bucket sizes in bytes (the reducer's ``compute_bucket_assignment_by_size``): parameters in
    reverse order, one running bucket per dtype, closed once it reaches its limit — 1 MiB for the first
    bucket of a dtype, 25 MiB after."""
    open_: dict[int, int] = {}
    limits: dict[int, int] = {}
    done: list[int] = []
    for s in reversed(shapes):
        key = s.element_size  # one dtype per element size among the planned dtypes
        open_[key] = open_.get(key, 0) + s.nbytes
        limit = limits.setdefault(key, DDP_FIRST_BUCKET_BYTES)
        if open_[key] >= limit:
            done.append(open_.pop(key))
            limits[key] = DDP_BUCKET_CAP_BYTES
    return done + [b for b in open_.values() if b]


def zero_partition(numel: int, n: int) -> int:
    """Elements of one rank's ZeRO partition: the flat buffer padded to a multiple of 2 x N."""
    align = ZERO_ALIGNMENT * n
    return -(-numel // align) * align // n


@dataclass(frozen=True)
class RankStates:
    """What one rank keeps of the model states, and the buffers its data parallelism adds."""

    weights: int
    gradients: int
    optimizer_states: int
    unsharded_forward: int = 0  # all-gathered parameters live at the forward's peak
    unsharded_backward: int = 0  # ... at the backward's peak
    unsharded_peak: int = 0  # the most held at once (the largest block's all-gather + the root's)
    communication: int = 0  # DDP buckets; FSDP/ZeRO reduce-scatter buffers at their largest
    backward_extra: int = 0  # transient gradients in flight at the backward's peak
    notes: tuple[str, ...] = ()


def fsdp_states(layout: Layout, n: int, optimizer: str, target: Target) -> RankStates:
    def r(nbytes: int) -> int:
        return allocation_bytes(nbytes, target)

    root, blocks = layout.groups[0], layout.groups[1:]
    shards = [tuple(shard_shape(s, n) for s in g) for g in layout.groups]
    weights = sum(r(s.nbytes) for g in shards for s in g) + layout.buffer_bytes
    gradients = sum(r(sum(s.nbytes for s in g)) for g in shards if g)
    opt = optimizer_state_bytes(optimizer, tuple(s for g in shards for s in g), target)
    root_gathered = sum(r(n * shard_shape(s, n).nbytes) for s in root)
    block_gathered = max((sum(r(n * shard_shape(s, n).nbytes) for s in g) for g in blocks), default=0)
    # Reduce-scatter of one group: its unsharded gradients copied into one padded flat input.
    rs = max((r(gathered_bytes(g, n)) for g in layout.groups if g), default=0)
    notes = (
        f"FSDP2: fully_shard on each {layout.block_class or 'block (none found: the root only)'} "
        "and the root; rank 0's (the largest dim-0 chunks)",
    )
    return RankStates(
        weights=weights,
        gradients=gradients,
        optimizer_states=opt,
        unsharded_forward=root_gathered,
        unsharded_backward=root_gathered,
        unsharded_peak=root_gathered + block_gathered,
        communication=rs,
        backward_extra=block_gathered,
        notes=notes,
    )


def ddp_states(layout: Layout, n: int, optimizer: str, target: Target) -> RankStates:
    shapes = layout.shapes
    buckets = ddp_buckets(shapes)
    weights = sum(allocation_bytes(s.nbytes, target) for s in shapes) + layout.buffer_bytes
    grads = sum(allocation_bytes(s.nbytes, target) for s in shapes)
    return RankStates(
        weights=weights,
        gradients=grads,
        optimizer_states=optimizer_state_bytes(optimizer, shapes, target),
        communication=sum(allocation_bytes(b, target) for b in buckets),
        notes=(
            "DDP: gradient buckets (first 1 MiB, then 25 MiB, parameters in reverse order) are a second "
            "copy of the gradients for the all-reduce; every rank holds the whole model",
        ),
    )


def zero_states(
    layout: Layout, n: int, stage: int, optimizer: str, mixed: bool, target: Target
) -> RankStates:
    """DeepSpeed ZeRO arithmetic. K bytes per parameter of optimizer state: the fp32 master copy plus
    the optimizer's own (AdamW: two fp32 moments), and the fp32 gradient partition DeepSpeed keeps for
    the step (counted with the gradients)."""
    shapes = layout.shapes
    numel = sum(s.numel for s in shapes)
    part = zero_partition(numel, n)
    low = 2 if mixed else 4  # bytes per element of the model's parameters and gradients
    moments = {"adamw": 8, "adamw-8bit": 2, "sgd": 4, "adafactor": 0, "adafactor-torch": 0}.get(optimizer, 8)
    largest = layout.largest_module
    if stage == 3:
        weights = low * part + layout.buffer_bytes
        gathered = low * largest
    else:
        weights = low * numel + layout.buffer_bytes
        gathered = 0
    opt = (4 + moments) * part  # fp32 master partition + the optimizer's moments on it
    if stage == 1:
        gradients = low * numel + 4 * part  # whole low-precision gradients + the fp32 partition
        comm = 0
    elif stage == 2:
        # Gradients reduced through the reduce bucket into the rank's partition (DeepSpeed's
        # estimator: 2 + 4 bytes of gradients per parameter, over N).
        gradients = low * part + 4 * part
        comm = low * min(numel, ZERO_REDUCE_BUCKET)
    else:
        # The fp32 gradient partition (DeepSpeed's estimator counts no 16-bit partition at stage 3) and
        # the largest module's gradients, whole while its backward runs.
        gradients = 4 * part + low * largest
        comm = 0
    del target  # DeepSpeed allocates flat buffers: the allocator's rounding is negligible
    return RankStates(
        weights=weights,
        gradients=gradients,
        optimizer_states=opt,
        unsharded_forward=gathered,
        unsharded_backward=gathered,
        unsharded_peak=gathered,
        communication=comm,
        notes=(
            f"DeepSpeed ZeRO-{stage}: the flat parameters padded to a multiple of 2 x N and partitioned; "
            "fp32 master weights with the optimizer states, the fp32 gradient partition with the gradients"
            + ("; the largest module's parameters and gradients gathered" if stage == 3 else ""),
        ),
    )


@dataclass
class RankPlan:
    """One rank's plan for one world size."""

    kind: str  # "fsdp" | "ddp" | "zero1" | "zero2" | "zero3"
    world_size: int
    components: dict[Component, int | None]
    at_peak: dict[Component, int]
    peak_bytes: int
    peak_phase: Phase
    phase_peaks: dict[Phase, int]
    total_bytes: int
    fits: bool | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "world_size": self.world_size,
            "components": {c.value: v for c, v in self.components.items()},
            "at_peak": {c.value: v for c, v in self.at_peak.items()},
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase.value,
            "phase_peaks": {p.value: v for p, v in self.phase_peaks.items()},
            "total_bytes": self.total_bytes,
            "fits": self.fits,
            "notes": list(self.notes),
        }


def requested(settings: PlanSettings) -> list[tuple[str, int]]:
    """(kind, world size) pairs the settings ask for, in the order given."""
    out = [("fsdp", n) for n in settings.fsdp] + [("ddp", n) for n in settings.ddp]
    if settings.zero is not None:
        out += [(f"zero{settings.zero}", n) for n in (settings.world_size or (1,))]
    return out


def rank_plan(planner: Any, settings: PlanSettings, kind: str, n: int, gpu: str | None = None) -> RankPlan:
    """Rank 0's plan of ``kind`` at world size ``n``, from the planner's single-device plan."""
    import torch

    from anatomy.plan.model import build_model
    from anatomy.plan.planner import ALLOCATOR_HEADROOM
    from anatomy.plan.quiet import warnings_off
    from anatomy.plan.states import optimizer_step_temporary_bytes
    from anatomy.plan.timeline import Category

    base = planner.plan(settings, gpu)
    prof = planner.profile(settings)
    states = planner.states
    target = settings.target
    if getattr(planner, "_layout", None) is None:
        with torch.device("meta"), warnings_off():
            model = build_model(planner.config, planner.task)
        planner._layout = layout_of(model, states.buffer_bytes)
    layout: Layout = planner._layout
    mixed = settings.precision.value != "fp32"
    if kind == "fsdp":
        rs = fsdp_states(layout, n, settings.optimizer, target)
    elif kind == "ddp":
        rs = ddp_states(layout, n, settings.optimizer, target)
    else:
        rs = zero_states(layout, n, int(kind[-1]), settings.optimizer, mixed, target)
    opt = rs.optimizer_states
    # The optimizer step's own transients scale with what the rank updates: its share of the states.
    share = rs.optimizer_states / max(base.components[Component.OPTIMIZER_STATES] or 1, 1)
    opt_temp = round(
        optimizer_step_temporary_bytes(settings.optimizer, states, target, settings.optimizer_impl)
        * min(share, 1)
    )
    comm_always = rs.communication if kind == "ddp" else 0  # DDP's buckets live from construction on
    # Under ZeRO the model itself is 16-bit (DeepSpeed's bf16/fp16 modes; no autocast copies of fp32
    # weights): its weights are the 16-bit parameters counted in the states.
    copies = 0 if kind.startswith("zero") else 1

    def phase(peak: Any, gathered: int, grads_in_flight: int) -> tuple[int, dict[Component, int]]:
        cats = peak.by_category
        grads_live = cats[Category.GRADIENT]
        if kind == "ddp":
            grads = grads_live
        elif grads_live:  # inside the blocks' backward: shards so far + one block's in flight
            grads = rs.gradients + grads_in_flight
        else:
            grads = 0
        at = {
            Component.WEIGHTS: rs.weights + copies * cats[Category.WEIGHT_COPY],
            Component.UNSHARDED_PARAMETERS: gathered,
            Component.OPTIMIZER_STATES: opt,
            Component.GRADIENTS: grads,
            Component.COMMUNICATION_BUFFERS: comm_always
            + (rs.communication if grads_live and kind != "ddp" else 0),
            Component.ACTIVATIONS: cats[Category.SAVED],
            Component.TEMPORARIES: cats[Category.TEMPORARY],
        }
        return sum(at.values()), at

    # Forward: the peak is at the end of forward (everything saved) unless it fell inside a block.
    fwd_block = rs.backward_extra if prof.forward.by_category[Category.SAVED] < prof.activations else 0
    fwd, fwd_at = phase(prof.forward, rs.unsharded_forward + fwd_block, 0)
    bwd_block = rs.backward_extra if prof.backward.by_category[Category.GRADIENT] else 0
    bwd, bwd_at = phase(prof.backward, rs.unsharded_backward + bwd_block, rs.backward_extra)
    opt_at = {
        Component.WEIGHTS: rs.weights,
        Component.OPTIMIZER_STATES: opt,
        Component.GRADIENTS: rs.gradients,
        Component.COMMUNICATION_BUFFERS: comm_always,
        Component.TEMPORARIES: prof.kept_after_backward + opt_temp,
    }
    peaks = {
        Phase.FORWARD: (fwd, fwd_at),
        Phase.BACKWARD: (bwd, bwd_at),
        Phase.OPTIMIZER: (sum(opt_at.values()), opt_at),
    }
    peak_phase = max(peaks, key=lambda p: peaks[p][0])
    peak, at_peak = peaks[peak_phase]
    at_peak = {c: v for c, v in at_peak.items() if v}
    cuda = target == Target.CUDA
    context = base.components.get(Component.CUDA_CONTEXT) if cuda else None
    headroom = (
        round(
            ALLOCATOR_HEADROOM
            * (at_peak.get(Component.ACTIVATIONS, 0) + at_peak.get(Component.TEMPORARIES, 0))
        )
        if cuda
        else None
    )
    components: dict[Component, int | None] = {
        Component.CUDA_CONTEXT: context,
        Component.ALLOCATOR_CACHE: headroom,
        Component.WEIGHTS: rs.weights + copies * prof.weight_copies,
        Component.UNSHARDED_PARAMETERS: rs.unsharded_peak or None,
        Component.OPTIMIZER_STATES: opt,
        Component.GRADIENTS: rs.gradients,
        Component.ACTIVATIONS: prof.activations,
        Component.COMMUNICATION_BUFFERS: rs.communication or None,
        Component.TEMPORARIES: at_peak.get(Component.TEMPORARIES, 0),
    }
    total = peak + (context or 0) + (headroom or 0)
    gpu_bytes = base.gpu_bytes
    return RankPlan(
        kind=kind,
        world_size=n,
        components=components,
        at_peak=at_peak,
        peak_bytes=peak,
        peak_phase=peak_phase,
        phase_peaks={p: v[0] for p, v in peaks.items()},
        total_bytes=total,
        fits=None if gpu_bytes is None else total <= gpu_bytes,
        notes=list(rs.notes),
    )


def rank_plans(planner: Any, settings: PlanSettings, gpu: str | None = None) -> list[RankPlan]:
    return [rank_plan(planner, settings, kind, n, gpu) for kind, n in requested(settings)]


__all__ = [
    "Layout",
    "RankPlan",
    "RankStates",
    "ddp_buckets",
    "ddp_states",
    "fsdp_states",
    "layout_of",
    "rank_plan",
    "rank_plans",
    "requested",
    "shard_shape",
    "zero_partition",
    "zero_states",
]
