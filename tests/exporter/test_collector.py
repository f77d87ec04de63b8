"""One scrape of the exporter against real publishers (the hook's own Publisher, the real wire protocol)
and the simulated NVML under unmodified pynvml: every figure is the one published, read back through
prometheus_client's parser; series are unique, N/A is absent, and a process that exits drops out."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from anatomy.protocol import Timing
from tui import simnvml
from tui.exporter.collector import NodeCollector
from tui.exporter.families import GPU_LABELS, INFO_LABELS
from tui.sanitize import clean

# dcgm-exporter's GPU labels (render_metrics.go), modelName renamed for Prometheus' linter.
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "model_name", "hostname"}


def _nvml_truth() -> tuple[dict[int, str], dict[int, int], dict[int, int]]:
    """Straight from pynvml, not through our NVML source: index → UUID, index → total bytes, and
    PID → used bytes."""
    pynvml.nvmlInit()
    try:
        uuids, totals, per_pid = {}, {}, {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuids[i] = uuid.decode() if isinstance(uuid, bytes) else uuid
            totals[i] = pynvml.nvmlDeviceGetMemoryInfo(h).total
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                per_pid[p.pid] = p.usedGpuMemory
        return uuids, totals, per_pid
    finally:
        pynvml.nvmlShutdown()


def test_scrape_holds_what_each_rank_published(
    runtime: Path,
    ranks: Callable[..., Any],
    sim: Callable[..., Any],
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    one: Callable[..., float],
    pick: Callable[..., Any],
) -> None:
    snaps, pids = {}, []
    for rank in range(2):
        hello = make_hello(0, rank=rank, local_rank=rank, world_size=2, run_id="job-7", device=f"cuda:{rank}")
        snaps[rank] = make_snapshot(0, seq=10 + rank, weights=6_000_000 + rank)
        pids.append(ranks(runtime, hello, snaps[rank]).pid)
    sim(simnvml.Scenario.demo_box(2, pids=pids))
    uuids, totals, per_pid = _nvml_truth()
    series = scrape(NodeCollector(dirs=[runtime], hostname="node-a"))

    for rank, snap in snaps.items():
        key = {"run_id": "job-7", "rank": str(rank)}
        for component, value in snap.memory.items():
            found = pick(series, "anatomy_memory_bytes", component=component, **key)
            if value is None:
                assert found == {}, f"unmeasured {component} must be absent, not 0"
            else:
                assert list(found.values()) == [float(value)]
        for component, value in snap.at_peak.items():
            assert one(series, "anatomy_memory_at_peak_bytes", component=component, **key) == value
        assert one(series, "anatomy_peak_memory_bytes", **key) == snap.peak_bytes
        t = snap.timing
        assert one(series, "anatomy_step_duration_seconds", **key) == t.step_s
        phases = {
            p: one(series, "anatomy_phase_duration_seconds", phase=p, **key)
            for p in ("forward", "backward", "optimizer", "other")
        }
        assert phases["forward"] == t.forward_s and phases["optimizer"] == t.optimizer_s
        assert sum(phases.values()) == pytest.approx(t.step_s, abs=1e-12)
        assert one(series, "anatomy_steps_total", **key) == snap.step + 1
        assert one(series, "anatomy_samples_per_second", **key) == t.samples_per_s
        assert one(series, "anatomy_tokens_per_second", **key) == t.tokens_per_s
        assert one(series, "anatomy_mfu_ratio", **key) == snap.mfu
        assert one(series, "anatomy_achieved_flops_per_second", **key) == pytest.approx(
            snap.achieved_tflops * 1e12
        )
        for group, stat in snap.op_groups.items():
            assert one(series, "anatomy_op_group_duration_seconds", group=group, **key) == stat.time_s
        assert one(series, "anatomy_cuda_memory_allocated_bytes", **key) == snap.cuda.allocated
        assert one(series, "anatomy_cuda_memory_reserved_bytes", **key) == snap.cuda.reserved
        assert one(series, "anatomy_cuda_alloc_retries_total", **key) == snap.cuda.alloc_retries
        assert one(series, "anatomy_snapshot_timestamp_seconds", **key) == pytest.approx(snap.time, abs=1e-3)
        assert one(series, "anatomy_hook_degraded", **key) == 0.0
        assert one(series, "anatomy_model_parameters", **key) == 1_000_000
        # NVML's own figure for the process beside the anatomy's, and its GPU on the info series.
        assert one(series, "anatomy_rank_gpu_memory_used_bytes", **key) == per_pid[pids[rank]]
        info = pick(series, "anatomy_rank_info", **key)
        assert list(info.values()) == [1.0]
        labels = dict(next(iter(info)))
        assert set(labels) == set(INFO_LABELS)
        assert labels["pid"] == labels["node_pid"] == str(pids[rank])
        assert labels["gpu_uuid"] == uuids[rank]
        assert labels["model"] == "LlamaForCausalLM" and labels["optimizer"] == "AdamW"
        assert labels["precision"] == "bf16_mixed" and labels["world_size"] == "2"
        # Of a rank's series, pid is on the info series only: it never multiplies the others (the
        # per-process series of every GPU process are by PID, and name no run or rank).
        assert not any(
            "pid" in dict(lab) or "node_pid" in dict(lab)
            for (name, lab) in series
            if name != "anatomy_rank_info" and not name.startswith("anatomy_process_")
        )
        assert not any("run_id" in dict(lab) for (name, lab) in series if name.startswith("anatomy_process_"))

    for index, uuid in uuids.items():
        gpu = pick(series, "anatomy_gpu_memory_total_bytes", gpu=str(index))
        assert list(gpu.values()) == [float(totals[index])]
        labels = dict(next(iter(gpu)))
        assert set(labels) == DCGM_LABELS == set(GPU_LABELS)
        assert (
            labels["UUID"] == uuid and labels["device"] == f"nvidia{index}" and labels["hostname"] == "node-a"
        )
        assert one(series, "anatomy_gpu_up", gpu=str(index)) == 1.0
        assert 0.0 <= one(series, "anatomy_gpu_utilization_ratio", gpu=str(index)) <= 1.0
        assert one(series, "anatomy_gpu_processes", gpu=str(index)) == 1.0
    assert one(series, "anatomy_exporter_nvml_up") == 1.0
    assert one(series, "anatomy_exporter_nvml_calls") > 0
    assert one(series, "anatomy_exporter_publishers", state="live") == 2.0


def test_a_process_that_exits_drops_its_series(
    runtime: Path,
    publishers: Callable[..., Any],
    no_nvml: None,
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    pick: Callable[..., Any],
) -> None:
    pid = os.getpid()
    first = publishers(runtime, make_hello(pid, rank=0, run_id="r"), make_snapshot(pid))
    publishers(runtime, make_hello(pid, rank=1, run_id="r"), make_snapshot(pid))
    collector = NodeCollector(dirs=[runtime])
    before = scrape(collector)
    assert {dict(lab)["rank"] for lab in pick(before, "anatomy_memory_bytes")} == {"0", "1"}
    first.close()
    after = scrape(collector)
    assert {dict(lab)["rank"] for lab in pick(after, "anatomy_memory_bytes")} == {"1"}
    assert {dict(lab)["rank"] for lab in pick(after, "anatomy_rank_info")} == {"1"}


def test_no_gpu_still_exports_the_training_processes(
    runtime: Path,
    publishers: Callable[..., Any],
    no_nvml: None,
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    one: Callable[..., float],
    pick: Callable[..., Any],
) -> None:
    pid = os.getpid()
    publishers(runtime, make_hello(pid, device="cpu"), make_snapshot(pid, cuda=None))
    series = scrape(NodeCollector(dirs=[runtime]))
    assert one(series, "anatomy_exporter_nvml_up") == 0.0
    assert not [name for name, _ in series if name.startswith("anatomy_gpu_")]
    assert pick(series, "anatomy_cuda_memory_allocated_bytes") == {}
    assert pick(series, "anatomy_rank_gpu_memory_used_bytes") == {}
    # Neither launcher nor rank: rank 0 of its own run, named after the process.
    assert (
        one(series, "anatomy_memory_bytes", component="weights", rank="0", run_id=f"local-{pid}") == 6_000_000
    )


def test_series_stay_unique_when_jobs_share_a_run_id_and_rank(
    runtime: Path,
    ranks: Callable[..., Any],
    no_nvml: None,
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    pick: Callable[..., Any],
) -> None:
    # Two torchrun launches without --rdzv-id on one node: both are run "none", both have a rank 0.
    ranks(runtime, make_hello(0, rank=0, run_id="none", started_at=1.0), make_snapshot(0))
    later = ranks(runtime, make_hello(0, rank=0, run_id="none", started_at=2.0), make_snapshot(0))
    series = scrape(NodeCollector(dirs=[runtime], ppid=lambda p: 4242))  # parse() asserts uniqueness
    run_ids = sorted(dict(lab)["run_id"] for lab in pick(series, "anatomy_rank_info"))
    assert run_ids == ["local-4242", f"local-4242-pid{later.pid}"]  # the first started keeps the plain key
    assert len(pick(series, "anatomy_memory_bytes", component="weights")) == 2


def _can_unshare_pid() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True, timeout=10)
    return probe.returncode == 0


def _only_child(pid: int) -> int:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_a_hook_in_another_pid_namespace_is_known_by_its_node_pid(
    runtime: Path,
    ranks: Callable[..., Any],
    no_nvml: None,
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    pick: Callable[..., Any],
) -> None:
    # A hook in a container (a real PID namespace) publishes the PID it sees there: 1. The kernel tells
    # the exporter which process on the node serves the socket.
    if not _can_unshare_pid():
        pytest.skip("creating a PID namespace (unshare --pid) needs root or user namespaces")
    rank = ranks(runtime, make_hello(1), make_snapshot(1), wrap=("unshare", "--pid", "--fork"))
    node_pid = _only_child(rank.pid)  # unshare forks the rank: PID 1 inside, node_pid outside
    series = scrape(NodeCollector(dirs=[runtime]))
    labels = dict(next(iter(pick(series, "anatomy_rank_info"))))
    assert labels["pid"] == "1" and labels["node_pid"] == str(node_pid)
    assert labels["run_id"] == f"local-{node_pid}"  # not "local-1": every container has a PID 1


def test_hostile_strings_are_sanitised_labels(
    runtime: Path,
    publishers: Callable[..., Any],
    no_nvml: None,
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    pick: Callable[..., Any],
) -> None:
    pid = os.getpid()
    model = 'Evil\x1b[2J"Model"\nnext\u202e'
    run_id = "run\x07" + "x" * 500
    publishers(runtime, make_hello(pid, rank=0, run_id=run_id, model_class=model), make_snapshot(pid))
    series = scrape(NodeCollector(dirs=[runtime]))
    labels = dict(next(iter(pick(series, "anatomy_rank_info"))))
    assert labels["model"] == clean(model) and "\x1b" not in labels["model"] and "\n" not in labels["model"]
    assert labels["run_id"].startswith("run\\x07") and len(labels["run_id"]) <= 128


def test_a_process_before_its_first_step_has_info_but_no_figures(
    runtime: Path,
    publishers: Callable[..., Any],
    no_nvml: None,
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    pick: Callable[..., Any],
) -> None:
    pid = os.getpid()
    publishers(runtime, make_hello(pid, rank=3, run_id="warmup"))
    series = scrape(NodeCollector(dirs=[runtime], first_wait_s=0.0), wait_s=0.5)
    assert len(pick(series, "anatomy_rank_info", rank="3", run_id="warmup")) == 1
    assert pick(series, "anatomy_memory_bytes") == {} and pick(series, "anatomy_step_duration_seconds") == {}


def test_missing_phase_times_give_no_made_up_split(
    runtime: Path,
    publishers: Callable[..., Any],
    no_nvml: None,
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    one: Callable[..., float],
    pick: Callable[..., Any],
) -> None:
    pid = os.getpid()
    publishers(runtime, make_hello(pid), make_snapshot(pid, timing=Timing(step_s=0.7), mfu=None))
    series = scrape(NodeCollector(dirs=[runtime]))
    assert one(series, "anatomy_step_duration_seconds") == 0.7
    assert pick(series, "anatomy_phase_duration_seconds") == {}
    assert pick(series, "anatomy_mfu_ratio") == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_root_believes_a_socket_only_if_its_directory_owner_owns_it(
    runtime: Path,
    publishers: Callable[..., Any],
    no_nvml: None,
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    pick: Callable[..., Any],
) -> None:
    pid = os.getpid()
    honest = publishers(runtime, make_hello(pid, rank=0, run_id="r"), make_snapshot(pid))
    planted = publishers(runtime, make_hello(pid, rank=1, run_id="r"), make_snapshot(pid))
    os.chown(planted.path, 4242, 4242)
    series = scrape(NodeCollector(dirs=[runtime]))
    assert honest.path is not None
    assert {dict(lab)["rank"] for lab in pick(series, "anatomy_rank_info")} == {"0"}
