"""The metric families of one scrape, from one NVML reading and the training processes' latest snapshots.

Names follow Prometheus' conventions: base units (bytes, seconds, ratios 0-1, watts, celsius) in the
name, ``_total`` for counters only. A value the source does not have (N/A on this GPU, unmeasured by
the hook) is left out, never written as 0.

GPU series carry dcgm-exporter's labels (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``hostname``;
``model_name`` for its ``modelName``, which Prometheus' linter rejects as camelCase), so
``on(UUID)`` or ``on(gpu, hostname)`` joins them with ``DCGM_FI_*`` series. A training process's
series carry ``run_id`` and ``rank`` (see ``identity``); everything else about it — PID, GPU, model,
optimizer, precision — is on its one ``anatomy_rank_info`` series, joined with
``* on(run_id, rank) group_left(...) anatomy_rank_info``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from anatomy.vocabulary import Component, OpGroup
from tui import __version__
from tui.exporter.gpu_processes import NodeProcess
from tui.exporter.identity import ProcessKey, label_value
from tui.sources.anatomy_source import TrainingProcess
from tui.sources.model import GpuInfo, GpuProcess, NvmlStatus

GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "model_name", "hostname")
# Every GPU process, per GPU it uses: bounded labels (the command is cleaned and capped).
PROCESS_LABELS = ("gpu", "UUID", "hostname", "pid", "command")
HOST_PROCESS_LABELS = ("hostname", "pid", "command")
RANK_LABELS = ("run_id", "rank")
INFO_LABELS = (
    *RANK_LABELS,
    "pid",
    "node_pid",
    "local_rank",
    "world_size",
    "hostname",
    "gpu_uuid",
    "device",
    "model",
    "optimizer",
    "precision",
)
PHASES = ("forward", "backward", "optimizer", "other")
# Keyed by str while the wire's maps are (their keys are members after decode, the hook's values in process).
_COMPONENT_ORDER: dict[str, int] = {c: i for i, c in enumerate(Component)}
_GROUP_ORDER: dict[str, int] = {g: i for i, g in enumerate(OpGroup)}


@dataclass(frozen=True)
class Rank:
    """One live training process of this scrape, with its series key and NVML's view of it."""

    key: ProcessKey
    process: TrainingProcess
    gpu: GpuInfo | None = None  # the GPU it trains on (NVML's largest entry for its PID)
    nvml_bytes: int | None = None  # NVML's memory figure for its PID on that GPU
    node_pid: int | None = None  # its PID as this node numbers it (differs from hello.pid in a container)


@dataclass(frozen=True)
class Scrape:
    """Everything one scrape read; ``families`` turns it into metrics."""

    hostname: str
    nvml: NvmlStatus
    gpus: Sequence[GpuInfo] = ()
    gpu_processes: Sequence[GpuProcess] = ()
    ranks: Sequence[Rank] = ()
    publishers: dict[str, int] = field(default_factory=dict)  # state -> count, every state of the sources
    nvml_calls: int = 0
    nvml_age_s: float = 0.0  # how old NVML's figures were at the scrape (read ahead of it, or 0)
    duration_s: float = 0.0
    rejected_dirs: int = 0
    processes: Sequence[NodeProcess] = ()  # every GPU process up to the cap, most GPU memory first
    processes_dropped: int = 0  # GPU processes beyond the cap


def gpu_of(
    pid: int, gpus: Sequence[GpuInfo], processes: Iterable[GpuProcess]
) -> tuple[GpuInfo | None, int | None]:
    """The GPU ``pid`` trains on and NVML's bytes for it there: its largest entry (a stray context on
    another GPU is small), as the monitor's reconciliation does."""
    best: GpuProcess | None = None
    for p in processes:
        if p.pid == pid and (best is None or (p.gpu_memory or 0) > (best.gpu_memory or 0)):
            best = p
    if best is None:
        return None, None
    gpu = next((g for g in gpus if g.index == best.gpu_index), None)
    return gpu, best.gpu_memory


class _Families:
    """Families in the order they were first asked for; empty ones are not emitted."""

    def __init__(self) -> None:
        self._all: dict[str, Metric] = {}

    def gauge(self, name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
        fam = self._all.get(name)
        if fam is None:
            fam = self._all[name] = GaugeMetricFamily(name, doc, labels=list(labels))
        assert isinstance(fam, GaugeMetricFamily)
        return fam

    def counter(self, name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
        fam = self._all.get(name)
        if fam is None:
            fam = self._all[name] = CounterMetricFamily(name, doc, labels=list(labels))
        assert isinstance(fam, CounterMetricFamily)
        return fam

    def emitted(self) -> list[Metric]:
        return [f for f in self._all.values() if f.samples]


def _put(fam: GaugeMetricFamily | CounterMetricFamily, labels: Sequence[str], value: float | None) -> None:
    if value is not None:
        fam.add_metric(list(labels), float(value))


def _ratio(percent: int | None) -> float | None:
    return None if percent is None else percent / 100.0


def gpu_labels(gpu: GpuInfo, hostname: str) -> tuple[str, ...]:
    return (
        str(gpu.index),
        label_value(gpu.uuid),
        label_value(gpu.bus_id),
        f"nvidia{gpu.index}",
        label_value(gpu.name),
        hostname,
    )


def _gpu_families(out: _Families, scrape: Scrape) -> None:
    up = out.gauge("anatomy_gpu_up", "1 if NVML answers for this GPU, 0 if it fell off the bus.", GPU_LABELS)
    used = out.gauge("anatomy_gpu_memory_used_bytes", "GPU memory in use (NVML).", GPU_LABELS)
    total = out.gauge("anatomy_gpu_memory_total_bytes", "GPU memory installed (NVML).", GPU_LABELS)
    util = out.gauge(
        "anatomy_gpu_utilization_ratio", "Share of the last sample period a kernel ran (0-1).", GPU_LABELS
    )
    mem_util = out.gauge(
        "anatomy_gpu_memory_utilization_ratio",
        "Share of the last sample period GPU memory was read or written (0-1).",
        GPU_LABELS,
    )
    power = out.gauge("anatomy_gpu_power_watts", "Power draw.", GPU_LABELS)
    limit = out.gauge("anatomy_gpu_power_limit_watts", "Enforced power limit.", GPU_LABELS)
    temp = out.gauge("anatomy_gpu_temperature_celsius", "GPU core temperature.", GPU_LABELS)
    fan = out.gauge("anatomy_gpu_fan_speed_ratio", "Fan speed as a share of its maximum (0-1).", GPU_LABELS)
    ecc = out.counter(
        "anatomy_gpu_ecc_volatile_uncorrected_errors",
        "Uncorrected ECC errors since the driver loaded.",
        GPU_LABELS,
    )
    procs = out.gauge("anatomy_gpu_processes", "Processes NVML lists on this GPU.", GPU_LABELS)
    counts: dict[int, int] = {}
    for p in scrape.gpu_processes:
        counts[p.gpu_index] = counts.get(p.gpu_index, 0) + 1
    for gpu in scrape.gpus:
        labels = gpu_labels(gpu, scrape.hostname)
        up.add_metric(list(labels), 0.0 if gpu.lost else 1.0)
        if gpu.lost:
            continue
        _put(used, labels, gpu.memory_used)
        _put(total, labels, gpu.memory_total)
        _put(util, labels, _ratio(gpu.gpu_util))
        _put(mem_util, labels, _ratio(gpu.memory_util))
        _put(power, labels, gpu.power_w)
        _put(limit, labels, gpu.power_limit_w)
        _put(temp, labels, gpu.temperature_c)
        _put(fan, labels, _ratio(gpu.fan_percent))
        _put(ecc, labels, gpu.ecc_volatile_uncorrected)
        procs.add_metric(list(labels), float(counts.get(gpu.index, 0)))


def _process_families(out: _Families, scrape: Scrape) -> None:
    memory = out.gauge(
        "anatomy_process_gpu_memory_used_bytes",
        "GPU memory a process holds on this GPU (NVML), for every GPU process.",
        PROCESS_LABELS,
    )
    sm = out.gauge(
        "anatomy_process_gpu_sm_utilization_ratio",
        "Share of the GPU's SM time the process used in its latest sample (0-1; NVML).",
        PROCESS_LABELS,
    )
    bandwidth = out.gauge(
        "anatomy_process_gpu_memory_bandwidth_utilization_ratio",
        "Share of the time the process read or wrote GPU memory in its latest sample (0-1; NVML).",
        PROCESS_LABELS,
    )
    rss = out.gauge(
        "anatomy_process_host_memory_rss_bytes",
        "Resident host memory of a GPU process.",
        HOST_PROCESS_LABELS,
    )
    uuids = {g.index: label_value(g.uuid) for g in scrape.gpus}
    for proc in scrape.processes:
        pid, command = str(proc.pid), proc.command
        _put(rss, (scrape.hostname, pid, command), proc.rss_bytes)
        # One series per GPU: MIG instances of one GPU (several entries) add up; their utilization is
        # not sampled (None).
        per_gpu: dict[int, list[GpuProcess]] = {}
        for entry in proc.entries:
            per_gpu.setdefault(entry.gpu_index, []).append(entry)
        for index, entries in sorted(per_gpu.items()):
            labels = (str(index), uuids.get(index, ""), scrape.hostname, pid, command)
            used = [e.gpu_memory for e in entries if e.gpu_memory is not None]
            _put(memory, labels, sum(used) if used else None)
            if len(entries) == 1:
                _put(sm, labels, _ratio(entries[0].sm_util))
                _put(bandwidth, labels, _ratio(entries[0].memory_bw_util))


def _info_labels(rank: Rank) -> tuple[str, ...]:
    hello = rank.process.hello
    assert hello is not None
    return (
        rank.key.run_id,
        rank.key.rank,
        str(hello.pid),
        str(rank.node_pid or hello.pid),
        "" if hello.local_rank is None else str(hello.local_rank),
        "" if hello.world_size is None else str(hello.world_size),
        label_value(hello.host),
        label_value(rank.gpu.uuid) if rank.gpu is not None else "",
        label_value(hello.device),
        label_value(hello.model_class),
        label_value(hello.optimizer_class or hello.optimizer),
        label_value(hello.precision),
    )


def _rank_families(out: _Families, ranks: Sequence[Rank]) -> None:
    info = out.gauge(
        "anatomy_rank_info",
        "One series per training process: its PID (own and on the node), GPU, model, optimizer, "
        "precision (value 1).",
        INFO_LABELS,
    )
    comp_labels = (*RANK_LABELS, "component")
    memory = out.gauge(
        "anatomy_memory_bytes",
        "Memory per component, each at its own maximum in the step (the hook's measurement).",
        comp_labels,
    )
    at_peak = out.gauge(
        "anatomy_memory_at_peak_bytes",
        "Memory per component at the moment of the step's peak; sums to anatomy_peak_memory_bytes.",
        comp_labels,
    )
    peak = out.gauge("anatomy_peak_memory_bytes", "The step's peak memory.", RANK_LABELS)
    nvml = out.gauge(
        "anatomy_rank_gpu_memory_used_bytes",
        "NVML's GPU memory figure for the process, on the GPU it trains on.",
        RANK_LABELS,
    )
    params = out.gauge("anatomy_model_parameters", "Parameters of the model the process trains.", RANK_LABELS)
    trainable = out.gauge(
        "anatomy_model_trainable_parameters",
        "Parameters that train (require a gradient): a LoRA adapter's few; gradients and optimizer states "
        "are per these.",
        RANK_LABELS,
    )
    quantization = out.gauge(
        "anatomy_weight_quantization_info",
        "The format of quantized weights (bitsandbytes nf4, fp4, int8), value 1; absent when not quantized.",
        (*RANK_LABELS, "quantization"),
    )
    step_time = out.gauge("anatomy_step_duration_seconds", "Wall time of the latest step.", RANK_LABELS)
    phase_time = out.gauge(
        "anatomy_phase_duration_seconds",
        "Wall time of the latest step per phase; the phases sum to anatomy_step_duration_seconds.",
        (*RANK_LABELS, "phase"),
    )
    steps = out.counter("anatomy_steps", "Training steps completed.", RANK_LABELS)
    samples = out.gauge("anatomy_samples_per_second", "Training samples per second.", RANK_LABELS)
    tokens = out.gauge("anatomy_tokens_per_second", "Training tokens per second.", RANK_LABELS)
    mfu = out.gauge(
        "anatomy_mfu_ratio", "Model FLOPs utilization: achieved / peak FLOP/s (0-1).", RANK_LABELS
    )
    flops = out.gauge(
        "anatomy_achieved_flops_per_second", "Achieved floating-point operations per second.", RANK_LABELS
    )
    groups = out.gauge(
        "anatomy_op_group_duration_seconds",
        "Time per step in each operation group, from the latest sampled step.",
        (*RANK_LABELS, "group"),
    )
    allocated = out.gauge(
        "anatomy_cuda_memory_allocated_bytes", "CUDA caching allocator: bytes in tensors.", RANK_LABELS
    )
    reserved = out.gauge(
        "anatomy_cuda_memory_reserved_bytes", "CUDA caching allocator: bytes reserved.", RANK_LABELS
    )
    retries = out.counter(
        "anatomy_cuda_alloc_retries", "CUDA allocations retried after freeing the cache.", RANK_LABELS
    )
    ooms = out.counter("anatomy_cuda_ooms", "CUDA out-of-memory errors raised by the allocator.", RANK_LABELS)
    stamp = out.gauge(
        "anatomy_snapshot_timestamp_seconds",
        "Unix time the hook built its latest snapshot: a stalled job stops advancing it.",
        RANK_LABELS,
    )
    degraded = out.gauge(
        "anatomy_hook_degraded", "1 if the hook reported that part of its measurement failed.", RANK_LABELS
    )
    for rank in ranks:
        key = (rank.key.run_id, rank.key.rank)
        info.add_metric(list(_info_labels(rank)), 1.0)
        hello, snap = rank.process.hello, rank.process.snapshot
        _put(nvml, key, rank.nvml_bytes)
        if hello is not None:
            _put(params, key, hello.parameter_count)
            _put(trainable, key, hello.trainable_parameter_count)
            if hello.weight_quantization is not None:  # one of a fixed set: checked at decode
                _put(quantization, (*key, hello.weight_quantization), 1.0)
        if snap is None:
            continue
        for name, value in sorted(snap.memory.items(), key=lambda kv: _COMPONENT_ORDER.get(kv[0], 99)):
            _put(memory, (*key, name), value)
        for name, value in sorted(
            (snap.at_peak or {}).items(), key=lambda kv: _COMPONENT_ORDER.get(kv[0], 99)
        ):
            _put(at_peak, (*key, name), value)
        _put(peak, key, snap.peak_bytes)
        t = snap.timing
        _put(step_time, key, t.step_s)
        parts = (t.forward_s, t.backward_s, t.optimizer_s)
        for phase, part in zip(PHASES, parts, strict=False):  # "other" is derived below
            _put(phase_time, (*key, phase), part)
        if t.step_s is not None and all(p is not None for p in parts):
            rest = t.step_s - sum(p for p in parts if p is not None)
            _put(phase_time, (*key, "other"), max(rest, 0.0))
        _put(steps, key, snap.step + 1)  # the snapshot carries the last step's 0-based index
        _put(samples, key, t.samples_per_s)
        _put(tokens, key, t.tokens_per_s)
        _put(mfu, key, snap.mfu)
        _put(flops, key, None if snap.achieved_tflops is None else snap.achieved_tflops * 1e12)
        for group, stat in sorted((snap.op_groups or {}).items(), key=lambda kv: _GROUP_ORDER.get(kv[0], 99)):
            _put(groups, (*key, group), stat.time_s)
        if snap.cuda is not None:
            _put(allocated, key, snap.cuda.allocated)
            _put(reserved, key, snap.cuda.reserved)
            _put(retries, key, snap.cuda.alloc_retries)
            _put(ooms, key, snap.cuda.ooms)
        _put(stamp, key, snap.time)
        degraded.add_metric(list(key), 1.0 if snap.error else 0.0)


def _exporter_families(out: _Families, scrape: Scrape) -> None:
    status = scrape.nvml
    out.gauge(
        "anatomy_exporter_info",
        "The exporter's version and the NVIDIA driver it reads (value 1).",
        ("version", "driver_version", "cuda_driver_version", "hostname"),
    ).add_metric(
        [
            __version__,
            label_value(status.driver_version),
            label_value(status.cuda_driver_version),
            scrape.hostname,
        ],
        1.0,
    )
    out.gauge("anatomy_exporter_nvml_up", "1 if NVML answered this scrape.", ()).add_metric(
        [], 1.0 if status.available else 0.0
    )
    out.gauge(
        "anatomy_exporter_nvml_calls", "NVML calls made for this scrape (at it, or just before it).", ()
    ).add_metric([], float(scrape.nvml_calls))
    out.gauge(
        "anatomy_exporter_nvml_age_seconds",
        "How old NVML's figures were at this scrape: read just before it when scrapes are steady, else 0.",
        (),
    ).add_metric([], scrape.nvml_age_s)
    out.gauge(
        "anatomy_exporter_collect_duration_seconds", "Time this scrape spent reading NVML and the hooks.", ()
    ).add_metric([], scrape.duration_s)
    pubs = out.gauge(
        "anatomy_exporter_publishers",
        "Hook sockets and OOM records the exporter knows, by state (live, oom, exited, error).",
        ("state",),
    )
    for state, count in sorted(scrape.publishers.items()):
        pubs.add_metric([state], float(count))
    out.gauge(
        "anatomy_exporter_processes_dropped",
        "GPU processes without per-process series this scrape: beyond --max-processes.",
        (),
    ).add_metric([], float(scrape.processes_dropped))
    out.gauge(
        "anatomy_exporter_rejected_dirs",
        "Runtime directories not read: wrong owner, writable by others, or a link.",
        (),
    ).add_metric([], float(scrape.rejected_dirs))


def families(scrape: Scrape) -> list[Metric]:
    out = _Families()
    _gpu_families(out, scrape)
    _process_families(out, scrape)
    _rank_families(out, scrape.ranks)
    _exporter_families(out, scrape)
    return out.emitted()
