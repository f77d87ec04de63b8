"""Frozen data for the app's tests: a hand-built 8-GPU box with a training job publishing its anatomy,
a 4-rank DDP job, a process that died of OOM, markup-like command lines, and fake sources."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from anatomy.protocol import CudaMemory, Hello, OpGroupStat, Snapshot, Suggestion, Timing
from anatomy.vocabulary import (
    Component,
    OpGroup,
    OptimizerKind,
    Precision,
    PublisherState,
    Source,
    expected_bytes_per_param,
)
from tui.sources.anatomy_source import TrainingProcess, TrainingReading, measured_total, rank_group_key
from tui.sources.model import GpuInfo, GpuProcess, HostInfo, MachineSnapshot, NvmlStatus

GiB = 1024**3
MiB = 1024**2
FROZEN_TIME = 1_790_000_000.0  # a fixed wall-clock time for every snapshot

TRAIN_PID = 4242
DDP_PIDS = (5100, 5101, 5102, 5103)
OOM_PID = 6001
CPU_TRAIN_PID = 7007  # publishes but holds no GPU memory (CPU training)
MARKUP_COMMANDS = ("python train.py [rank0]", "[/]", "[bold red]boom[/]")

PARAMS = 124_439_808  # GPT-2 small
MODEL_BYTES: dict[Component, int] = {
    Component.WEIGHTS: 6 * PARAMS,
    Component.OPTIMIZER_STATES: 8 * PARAMS,
    Component.GRADIENTS: 4 * PARAMS,
    Component.ACTIVATIONS: 9 * GiB + 512 * MiB,
    Component.TEMPORARIES: 512 * MiB,
    Component.UNATTRIBUTED: 64 * MiB,
}
MODEL_SUM = sum(MODEL_BYTES.values())
RESERVED = MODEL_SUM + 1200 * MiB
CONTEXT = 1250 * MiB
NVML_TRAIN_BYTES = RESERVED + CONTEXT


def gpu(index: int, used: int = 2 * GiB, util: int | None = 37, **kw: object) -> GpuInfo:
    base = GpuInfo(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
        persistence_mode=True,
        bus_id=f"00000000:{0x18 + index:02X}:00.0",
        display_active=False,
        ecc_volatile_uncorrected=0,
        fan_percent=None,
        temperature_c=40 + index,
        performance_state=0,
        power_w=120.0 + 10 * index,
        power_limit_w=700.0,
        memory_total=80 * GiB,
        memory_used=used,
        memory_free=80 * GiB - used,
        memory_reserved=512 * MiB,
        gpu_util=util,
        memory_util=None if util is None else util // 2,
        compute_mode="Default",
        mig_mode=False,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def gpu_process(
    gpu_index: int,
    pid: int,
    gpu_memory: int,
    command: str,
    user: str = "alice",
    cpu: float = 3.5,
    rss: int = 2 * GiB,
    running: float = 3725.0,
) -> GpuProcess:
    return GpuProcess(
        gpu_index=gpu_index,
        pid=pid,
        type="C",
        gpu_memory=gpu_memory,
        name=command.split()[0] if command.split() else command,
        user=user,
        command=command,
        cpu_percent=cpu,
        host_rss=rss,
        running_time_s=running,
    )


def host() -> HostInfo:
    return HostInfo(
        cpu_percent=23.4,
        cpu_count=64,
        memory_total=512 * GiB,
        memory_used=97 * GiB,
        memory_available=415 * GiB,
        swap_total=8 * GiB,
        swap_used=0,
        load_avg=(5.25, 4.5, 3.75),
        hostname="gpu-box-1",
    )


NVML_OK = NvmlStatus(
    available=True, driver_version="550.54.15", cuda_driver_version="12.4", nvml_version="12.550.54.15"
)
NVML_MISSING = NvmlStatus(
    available=False, reason="NVIDIA driver not found (libnvidia-ml.so.1 could not be loaded)"
)


def demo_processes() -> tuple[GpuProcess, ...]:
    procs = [
        gpu_process(0, TRAIN_PID, NVML_TRAIN_BYTES, "python train_gpt2.py --bf16 --batch 16", cpu=98.5),
        gpu_process(
            1, 3001, 20 * GiB, "python serve.py --port 8000", user="bob", cpu=12.0, running=86400.0 * 3
        ),
        gpu_process(2, 3002, 6 * GiB, MARKUP_COMMANDS[0], user="carol", cpu=45.0),
        gpu_process(3, 3003, 1 * GiB, MARKUP_COMMANDS[1], user="dave", cpu=0.5, running=59.0),
        gpu_process(3, 3004, 512 * MiB, MARKUP_COMMANDS[2], user="erin", cpu=1.5, running=610.0),
    ]
    for rank, pid in enumerate(DDP_PIDS):
        procs.append(
            gpu_process(
                4 + rank,
                pid,
                NVML_TRAIN_BYTES + rank * 100 * MiB,
                f"python -m torch.distributed.run ddp_train.py --local_rank={rank}",
                user="frank",
                cpu=99.0 - rank,
            )
        )
    return tuple(procs)


def machine(
    gpus: Sequence[GpuInfo] | None = None,
    processes: Sequence[GpuProcess] | None = None,
    nvml: NvmlStatus = NVML_OK,
    time: float = FROZEN_TIME,
) -> MachineSnapshot:
    procs = tuple(processes) if processes is not None else demo_processes()
    if gpus is None:
        used = {i: 0 for i in range(8)}
        for p in procs:
            used[p.gpu_index] = used.get(p.gpu_index, 0) + (p.gpu_memory or 0)
        gpus = [gpu(i, used=used[i] + 600 * MiB, util=(i * 13) % 101) for i in range(8)]
    return MachineSnapshot(time=time, nvml=nvml, gpus=tuple(gpus), processes=procs, host=host())


def no_gpu_machine() -> MachineSnapshot:
    return MachineSnapshot(time=FROZEN_TIME, nvml=NVML_MISSING, gpus=(), processes=(), host=host())


def big_machine(n_gpus: int = 16, n_procs: int = 300) -> MachineSnapshot:
    gpus = [gpu(i, used=(i + 1) * GiB, util=(i * 7) % 100) for i in range(n_gpus)]
    procs = [
        gpu_process(i % n_gpus, 10_000 + i, (i % 37 + 1) * 64 * MiB, f"worker-{i} --shard {i}", cpu=i % 100)
        for i in range(n_procs)
    ]
    return MachineSnapshot(
        time=FROZEN_TIME, nvml=NVML_OK, gpus=tuple(gpus), processes=tuple(procs), host=host()
    )


# -- the training side ------------------------------------------------------------------------------


def hello(
    pid: int,
    device: str = "cuda:0",
    model_class: str = "GPT2LMHeadModel",
    rank: int | None = None,
    world_size: int | None = None,
    parameter_count: int = PARAMS,
) -> Hello:
    return Hello(
        pid=pid,
        host="gpu-box-1",
        device=device,
        precision=Precision.BF16_MIXED.value,
        optimizer=OptimizerKind.ADAMW.value,
        model_class=model_class,
        parameter_count=parameter_count,
        torch_version="2.4.1",
        started_at=FROZEN_TIME - 3600,
        rank=rank,
        local_rank=rank,
        world_size=world_size,
        dtype="float32",
        optimizer_class="AdamW",
    )


def expected_table() -> dict[str, float | None]:
    return {
        c.value: expected_bytes_per_param(c, Precision.BF16_MIXED, OptimizerKind.ADAMW) for c in Component
    }


SUGGESTIONS = (
    Suggestion(
        rule="gradient_checkpointing",
        title="Enable gradient checkpointing",
        detail="Activations are 75% of the peak; recompute them in backward [~20% slower].",
        source=Source.PREDICTED.value,
        saving_bytes=7 * GiB,
        speed_factor=0.8,
    ),
    Suggestion(
        rule="adamw_8bit",
        title="Use an 8-bit AdamW",
        detail="Optimizer states take 8 bytes/param; 8-bit states take 2.",
        source=Source.GUIDE.value,
        saving_bytes=6 * PARAMS,
    ),
)


def snapshot(
    pid: int,
    step: int = 1200,
    memory: Mapping[Component, int | None] | None = None,
    cuda: bool = True,
    oom: str | None = None,
    step_s: float = 0.412,
    at_peak: bool = True,
) -> Snapshot:
    mem = dict(MODEL_BYTES if memory is None else memory)
    # ``mem`` is the split at the peak; each component's own maximum is above it for activations and
    # temporaries (a peak in backward: part of the activations already freed).
    maxima = {c.value: v for c, v in mem.items()}
    for c, extra in ((Component.ACTIVATIONS, 1.25), (Component.TEMPORARIES, 1.5)):
        value = maxima.get(c.value)
        if value is not None:
            maxima[c.value] = int(value * extra)
    op_groups = {
        OpGroup.CONTRACTION.value: OpGroupStat(flops=2.9e12, time_s=0.250),
        OpGroup.NORMALIZATION.value: OpGroupStat(flops=3.0e9, time_s=0.045),
        OpGroup.ELEMENTWISE.value: OpGroupStat(flops=5.0e9, time_s=0.080),
        OpGroup.OPTIMIZER.value: OpGroupStat(flops=1.5e9, time_s=0.030),
        OpGroup.OTHER.value: OpGroupStat(flops=None, time_s=0.007),
    }
    return Snapshot(
        pid=pid,
        seq=step,
        time=FROZEN_TIME,
        step=step,
        memory=maxima,
        at_peak={c.value: v for c, v in mem.items()} if at_peak else None,
        at_peak_step=step - 100 if at_peak else None,
        expected_bytes_per_param=expected_table(),
        parameter_count=PARAMS,
        peak_bytes=sum(v for v in mem.values() if v is not None),
        peak_phase="backward",
        memory_source="cuda_allocator" if cuda else "glibc",
        cuda=CudaMemory(
            allocated=MODEL_SUM, reserved=RESERVED, peak_allocated=MODEL_SUM, alloc_retries=0, ooms=0
        )
        if cuda
        else None,
        timing=Timing(
            step_s=step_s,
            forward_s=0.120,
            backward_s=0.250,
            optimizer_s=0.042,
            samples_per_s=38.8,
            tokens_per_s=39_740.0,
        ),
        op_groups=op_groups,
        op_groups_step=1150,
        achieved_tflops=412.3,
        mfu=0.4168,
        suggestions=list(SUGGESTIONS),
        oom=oom,
    )


def training_process(
    pid: int,
    hello_: Hello,
    snap: Snapshot | None,
    state: PublisherState = PublisherState.LIVE,
    oom: str | None = None,
    error: str | None = None,
    history: int = 40,
) -> TrainingProcess:
    base = measured_total(snap) if snap is not None else 0
    # a warm-up ramp to the steady state, then a small saw-tooth (allocator cache growing, trimmed)
    memory_history = tuple(
        int(base * (0.7 + 0.3 * min(1.0, i / 12))) - (i % 6) * 16 * MiB for i in range(history)
    )
    step_history = tuple(
        step_s_of(snap) * (1.6 if i < 2 else 1.0 + 0.04 * ((i * 5) % 7) / 7) for i in range(history)
    )
    return TrainingProcess(
        pid=pid,
        hello=hello_,
        snapshot=snap,
        state=state,
        error=error,
        memory_history=memory_history,
        step_time_history=step_history,
        rank_group=rank_group_key(hello_),
        oom=oom,
    )


def step_s_of(snap: Snapshot | None) -> float:
    return snap.timing.step_s if snap is not None and snap.timing.step_s is not None else 0.4


OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB "
    "[/] of which 1.02 GiB is free. [bold]Process 6001[/bold]"
)


def training() -> list[TrainingProcess]:
    """The main job on GPU 0, the 4 DDP ranks, and a process that died of OOM."""
    procs = [training_process(TRAIN_PID, hello(TRAIN_PID), snapshot(TRAIN_PID))]
    for rank, pid in enumerate(DDP_PIDS):
        procs.append(
            training_process(
                pid,
                hello(pid, device=f"cuda:{rank}", model_class="LlamaForCausalLM", rank=rank, world_size=4),
                snapshot(pid, step=800 + rank, step_s=0.9 + rank * 0.01),
            )
        )
    procs.append(
        training_process(
            OOM_PID,
            hello(OOM_PID, model_class="BertForMaskedLM"),
            snapshot(OOM_PID, step=17, oom=OOM_TEXT),
            state=PublisherState.OOM,
            oom=OOM_TEXT,
        )
    )
    return procs


def cpu_training() -> TrainingProcess:
    mem = dict(MODEL_BYTES)
    return training_process(
        CPU_TRAIN_PID,
        hello(CPU_TRAIN_PID, device="cpu", model_class="BertForMaskedLM [tiny]"),
        snapshot(CPU_TRAIN_PID, memory=mem, cuda=False),
    )


# -- fake sources ----------------------------------------------------------------------------------


class FakeMachineSource:
    def __init__(self, *snapshots: MachineSnapshot, fail: Exception | None = None) -> None:
        self.snapshots = list(snapshots) or [machine()]
        self.fail = fail
        self.calls = 0
        self.closed = False

    def snapshot(self) -> MachineSnapshot:
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        index = min(self.calls - 1, len(self.snapshots) - 1)
        return self.snapshots[index]

    def close(self) -> None:
        self.closed = True


class FakeAnatomySource:
    def __init__(self, processes: Sequence[TrainingProcess] | None = None) -> None:
        self.processes = list(processes) if processes is not None else training()
        self.calls = 0
        self.closed = False
        self.dismissed: list[int] = []

    def read(self) -> TrainingReading:
        self.calls += 1
        return TrainingReading(processes=tuple(p for p in self.processes if p.pid not in self.dismissed))

    def dismiss(self, pid: int) -> bool:
        self.dismissed.append(pid)
        return True

    def close(self) -> None:
        self.closed = True


def frozen_host_lookup(pids: Sequence[int]) -> dict[int, GpuProcess]:
    """Fixed host figures for publishing processes NVML does not list (no psutil on fake PIDs)."""
    return {
        pid: GpuProcess(
            gpu_index=-1,
            pid=pid,
            type="-",
            user="alice",
            command=f"python cpu_train.py --pid {pid}",
            cpu_percent=99.0,
            host_rss=3 * GiB,
            running_time_s=125.0,
        )
        for pid in pids
    }
