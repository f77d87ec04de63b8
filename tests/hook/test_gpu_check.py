"""scripts/gpu_check without a GPU: its verdicts (each comparison, passing and failing), the one line it
prints here, its whole pipeline run on the CPU through stand-ins for ``torch.cuda``'s functions, and the paged
optimizer's managed memory as the hook publishes it and the monitor takes it out of the CUDA context."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import anatomy
from anatomy import protocol
from anatomy.gpucheck import verdicts as v
from anatomy.gpucheck.probe import cuda_missing
from anatomy.hook.backend import CudaBackend
from anatomy.hook.cuda import CudaAllocator
from anatomy.hook.heap import HostHeap
from anatomy.hook.paged import paged_state_bytes
from anatomy.hook.tensors import optimizer_state_bytes
from anatomy.protocol import CudaMemory
from anatomy.vocabulary import Component
from tests.hook.cuda_standins import nested_stats
from tui.report.anatomy_json import reconciled_dict
from tui.sources.reconcile import reconcile

ROOT = Path(__file__).resolve().parents[2]
MIB = 2**20

# -- the verdicts --------------------------------------------------------------------------------------------


def test_component_is_exact_unless_a_tolerance_is_given() -> None:
    assert v.component("w", "weights", 1000, 1000).status == v.PASS
    assert v.component("w", "weights", 1001, 1000).status == v.FAIL
    assert v.component("w", "activations", 1040, 1000, tolerance=0.05).status == v.PASS
    assert v.component("w", "activations", 1060, 1000, tolerance=0.05).status == v.FAIL
    unmeasured = v.component("w", "gradients", None, 1000)
    assert unmeasured.status == v.FAIL and "unmeasured" in unmeasured.detail


def test_reconciliation_needs_nvmls_total_an_exact_sum_and_a_plausible_context() -> None:
    good = dict(
        nvml=3 * v.GIB, total_source="nvml", reconciles=True, rows=v.GIB, context=600 * MIB, cache=MIB
    )
    assert v.reconciliation("w", **good).status == v.PASS  # type: ignore[arg-type]
    assert v.reconciliation("w", **{**good, "reconciles": False}).status == v.FAIL  # type: ignore[arg-type]
    assert v.reconciliation("w", **{**good, "total_source": "reserved"}).status == v.FAIL  # type: ignore[arg-type]
    assert v.reconciliation("w", **{**good, "nvml": None}).status == v.FAIL  # type: ignore[arg-type]
    huge = v.reconciliation("w", **{**good, "context": 5 * v.GIB})  # type: ignore[arg-type]
    assert huge.status == v.FAIL and "implausibly" in huge.detail
    paged = v.reconciliation("w", **{**good, "managed": 64 * MIB})  # type: ignore[arg-type]
    assert paged.status == v.PASS and "managed 64.00 MiB" in paged.detail


def test_the_users_peak_must_read_the_same_and_never_be_reset() -> None:
    assert v.peak_untouched("w", [10, 12], [10, 12], 0).status == v.PASS
    assert v.peak_untouched("w", [10, 12], [10, 13], 0).status == v.FAIL
    reset = v.peak_untouched("w", [10, 12], [10, 12], 1)
    assert reset.status == v.FAIL and "reset_peak_memory_stats" in reset.detail
    assert v.peak_untouched("w", [], [], 0).status == v.FAIL
    assert v.peak_matches_user("w", 500, 500).status == v.PASS
    assert v.peak_matches_user("w", 499, 500).status == v.FAIL


def test_phase_times_sum_within_the_step_and_the_step_matches_the_wall_clock() -> None:
    ok = dict(forward=0.010, backward=0.020, optimizer=0.005, step=0.036, wall=0.037)
    assert v.phase_times("w", **ok).status == v.PASS
    assert v.phase_times("w", **{**ok, "backward": 0.040}).status == v.FAIL  # phases exceed the step
    assert v.phase_times("w", **{**ok, "wall": 0.060}).status == v.FAIL  # step far from the wall clock
    missing = v.phase_times("w", **{**ok, "optimizer": None})
    assert missing.status == v.FAIL and "optimizer" in missing.detail


def test_mfu_is_skipped_on_an_unknown_gpu_and_checked_on_a_known_one() -> None:
    args = dict(device="NVIDIA H100 80GB HBM3", hook_mfu=0.1, hook_tflops=98.9, independent_tflops=95.0)
    assert v.mfu("w", **args, peak_tflops=989.0).status == v.PASS  # type: ignore[arg-type]
    assert v.mfu("w", **args, peak_tflops=None).status == v.SKIP  # type: ignore[arg-type]
    off = {**args, "independent_tflops": 50.0}
    assert v.mfu("w", **off, peak_tflops=989.0).status == v.FAIL  # type: ignore[arg-type]
    inconsistent = {**args, "hook_mfu": 0.2}
    assert v.mfu("w", **inconsistent, peak_tflops=989.0).status == v.FAIL  # type: ignore[arg-type]
    assert v.mfu("w", **{**args, "hook_mfu": None}, peak_tflops=989.0).status == v.FAIL  # type: ignore[arg-type]


def test_managed_memory_must_be_named_and_kept_out_of_the_context() -> None:
    base = dict(hook_managed=64 * MIB, independent=64 * MIB, taken=64 * MIB, nvml=2 * v.GIB, reserved=v.GIB)
    context = 2 * v.GIB - v.GIB - 64 * MIB
    assert v.managed_memory("w", **base, context=context).status == v.PASS  # type: ignore[arg-type]
    absorbed = v.managed_memory("w", **base, context=v.GIB)  # type: ignore[arg-type]
    assert absorbed.status == v.FAIL
    unnamed = v.managed_memory("w", **{**base, "hook_managed": 0}, context=context)  # type: ignore[arg-type]
    assert unnamed.status == v.FAIL and "no managed figure" in unnamed.detail
    none = v.managed_memory("w", **{**base, "independent": 0}, context=context)  # type: ignore[arg-type]
    assert none.status == v.FAIL


def test_monitor_json_must_list_the_process_and_reconcile_it() -> None:
    pid = 4242
    doc: dict[str, Any] = {
        "nvml": {"available": True, "driver_version": "550.54.15"},
        "gpus": [{"index": 0}],
        "processes": [{"pid": pid, "gpu_memory": 3 * v.GIB}],
        "training": [
            {"pid": pid, "reconciled": {"total": 3 * v.GIB, "total_source": "nvml", "reconciles": True}}
        ],
    }
    assert [x.status for x in v.monitor_json(doc, pid)] == [v.PASS] * 3
    assert v.monitor_json(doc, pid + 1)[1].status == v.FAIL
    doc["training"][0]["reconciled"]["reconciles"] = False
    assert v.monitor_json(doc, pid)[-1].status == v.FAIL
    off = v.monitor_json({"nvml": {"available": False, "reason": "no driver"}}, pid)
    assert [x.status for x in off] == [v.FAIL, v.FAIL] and "no driver" in off[0].detail
    assert "not among the training processes" in off[1].detail


def test_losses_table_and_exit_status() -> None:
    assert v.losses("w", [1.0, 2.0], [1.0, 2.0]).status == v.PASS
    assert v.losses("w", [1.0, 2.0], [1.0, 2.0001]).status == v.PASS  # GPU nondeterminism
    assert v.losses("w", [1.0, 2.0], [1.0, 2.1]).status == v.FAIL
    failed = v.failed_workload("w", ["a", "b"], RuntimeError("CUDA out of memory\nmore"))
    assert [x.detail for x in failed] == ["not run: RuntimeError: CUDA out of memory"] * 2
    verdicts = [v.Verdict("w", "a", v.PASS, "ok"), v.Verdict("w", "b", v.SKIP, "-")]
    assert v.exit_status(verdicts) == 0
    assert v.exit_status([*verdicts, *failed]) == 1
    text = v.table([*verdicts, *failed])
    assert text.splitlines()[-1] == "1 passed, 2 failed, 1 skipped"


def test_resting_must_publish_what_every_step_built_publishes_and_most_steps_must_rest() -> None:
    steps = [{"step": i, "memory": {"weights": 10}, "peak_bytes": 100 + i} for i in range(3)]
    same = v.resting_same("w", steps, [dict(s) for s in steps], [5, 6, 6], [5, 6, 6])
    assert same.status == v.PASS and same.detail.startswith("3 steps identical")
    moved = [dict(s) for s in steps]
    moved[1] = {**moved[1], "peak_bytes": 99, "memory": {"weights": 11}}
    differs = v.resting_same("w", steps, moved, [], [])
    assert differs.status == v.FAIL and differs.detail == "step 1 differs in memory, peak_bytes"
    assert v.resting_same("w", steps, steps[:2], [], []).status == v.FAIL
    assert v.resting_same("w", [], [], [], []).status == v.FAIL  # (nothing compared)
    user = v.resting_same("w", steps, steps, [5, 6, 6], [5, 7, 7])
    assert user.status == v.FAIL and user.detail.endswith("after step 1")
    short = v.resting_same("w", steps, steps, [5, 6, 6], [5, 6])
    assert short.status == v.FAIL and short.detail.endswith("after step 2")
    assert v.rested("w", 57, 60).status == v.PASS
    few = v.rested("w", 29, 60)
    assert few.status == v.FAIL and few.detail.startswith("29 of 60 step blocks rested")
    timed = v.rested("w", 57, 60, (0.00125, 0.0016))
    assert timed.detail.endswith("; a step 1.250 ms, every step built 1.600 ms")


# -- here: no CUDA -------------------------------------------------------------------------------------------


def test_the_script_says_so_in_one_line_and_exits_0_without_cuda() -> None:
    env = {k: val for k, val in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n") == 1 and out.stdout.startswith("gpu_check: no CUDA here, nothing checked")
    assert "CPU-only" in out.stdout or "no CUDA device" in out.stdout
    assert out.stderr == ""


def test_a_cuda_build_without_a_device_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    reason = cuda_missing()
    assert reason is not None and "sees no CUDA device" in reason


# -- the whole pipeline, on the CPU through stand-ins for torch.cuda ----------------------------------------


class StandInCuda:
    """torch.cuda's allocator functions over glibc's heap (this process's memory in use): enough for the
    check's own readings to be real numbers on a CPU."""

    def __init__(self) -> None:
        self.heap = HostHeap()
        self.peak = self.now()
        self.resets = 0

    def now(self) -> int:
        return int(self.heap.in_use() or 0)

    def memory_allocated(self, device: Any = None) -> int:
        now = self.now()
        self.peak = max(self.peak, now)
        return now

    def max_memory_allocated(self, device: Any = None) -> int:
        return max(self.peak, self.now())

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.resets += 1
        self.peak = self.now()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in ("memory_allocated", "max_memory_allocated", "reset_peak_memory_stats"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)


def _tiny_workload(monitor: bool) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    from anatomy.gpucheck.workloads import Workload

    def build() -> torch.nn.Module:
        cfg = LlamaConfig(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=32,
            use_cache=False,
        )
        return LlamaForCausalLM(cfg)

    def batch(i: int, dev: torch.device) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(i)).to(dev)
        return {"input_ids": ids, "labels": ids}

    def adamw(model: torch.nn.Module) -> Any:
        return torch.optim.AdamW(model.parameters(), lr=1e-4)  # as the check's own workloads train

    return Workload("tiny-llama", build, batch, adamw, 2, 32, monitor=monitor, steps=4)


def test_the_pipeline_runs_every_check_and_fails_each_gpu_one_on_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from anatomy.gpucheck import cli

    cuda = StandInCuda()
    cuda.install(monkeypatch)
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(tmp_path / "run"))
    verdicts = cli.check_workload(_tiny_workload(monitor=True), torch.device("cpu"))
    by_check = {x.check: x for x in verdicts}
    assert set(cli.CHECKS) <= set(by_check)
    assert "anatomy-top --once --json" in {x.check for x in verdicts} or any(
        x.workload == "monitor" for x in verdicts
    )
    # what the CPU can settle passes: the hook's sums against the counts made in the check itself, the losses
    for check in (
        "losses with hook = without",
        "weights vs independent count",
        "gradients vs independent count",
        "optimizer states vs independent count",
    ):
        assert by_check[check].status == v.PASS, by_check[check]
    # the user's peak: never reset by the hook; its readings differ here only because the stand-in's
    # "allocated" is the host heap, where the hook's own bookkeeping lives (on a GPU it holds no device
    # memory)
    untouched = by_check["user's max_memory_allocated untouched"]
    assert "reset_peak_memory_stats" not in untouched.detail
    assert untouched.status == v.PASS or untouched.detail.startswith("differs with the hook")
    # the GPU's own checks fail, each on its own line saying why — none is an exception in the check
    assert by_check["context + cache + rows = NVML"].status == v.FAIL
    assert by_check["MFU on a known GPU"].status in (v.SKIP, v.FAIL)
    assert not any(x.detail.startswith("check failed") for x in verdicts), [x for x in verdicts if x.failed]
    monitor = [x for x in verdicts if x.workload == "monitor"]
    assert monitor and monitor[0].status == v.FAIL  # no driver here: NVML not available, said so
    # the monitor read the hook's socket: the training process is there, only NVML's figure is missing
    assert "listed among the training processes" in monitor[-1].detail
    # the user's own resets, through the stand-in: the unmeasured first run's 2 steps, then 4 steps of each
    # compared run
    assert cuda.resets == cli.WARMUP_RUN_STEPS + 8


def test_the_compared_runs_follow_an_unmeasured_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A process's first run on a GPU pays the libraries' start-up inside its first step (seen on an H100 and
    an H200: +30.5 MiB on step 0's peak, hook or not), so neither compared run may be the process's first."""
    from anatomy.gpucheck import cli, workloads

    runs: list[tuple[int, bool, bool]] = []
    real = workloads.train

    def counted(work: Any, hooked: bool, directory: Path, dev: torch.device) -> Any:
        runs.append((work.steps, hooked, work.monitor))
        return real(work, hooked, directory, dev)

    monkeypatch.setattr(workloads, "train", counted)
    StandInCuda().install(monkeypatch)
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(tmp_path / "run"))
    verdicts = cli.check_workload(_tiny_workload(monitor=False), torch.device("cpu"))
    assert runs == [(cli.WARMUP_RUN_STEPS, False, False), (4, False, False), (4, True, False)]
    losses = {x.check: x for x in verdicts}["losses with hook = without"]
    assert losses.status == v.PASS and "4 steps" in losses.detail


def test_a_workload_that_cannot_run_fails_each_of_its_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    from anatomy.gpucheck import cli
    from anatomy.gpucheck.workloads import Workload

    def broken() -> torch.nn.Module:
        raise RuntimeError("CUDA error: no kernel image is available")

    work = Workload("broken", broken, lambda i, d: {}, lambda m: None, 1, None)
    verdicts = cli.check_workload(work, torch.device("cpu"))
    assert len(verdicts) == len(cli.CHECKS)
    assert all(x.failed and "no kernel image" in x.detail for x in verdicts)


# -- paged optimizer states: named by the hook, taken out of the CUDA context by the monitor ---------------


def _paged_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer, int]:
    """AdamW whose first moments are marked paged, as bitsandbytes marks its managed-memory buffers."""
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    paged = 0
    for st in opt.state.values():
        st["exp_avg"].is_paged = True  # type: ignore[attr-defined]
        paged += st["exp_avg"].untyped_storage().nbytes()
    return model, opt, paged


def test_paged_state_tensors_are_their_own_figure_not_optimizer_states() -> None:
    _model, opt, paged = _paged_optimizer()
    everything = sum(t.untyped_storage().nbytes() for st in opt.state.values() for t in st.values())
    assert paged_state_bytes(opt) == paged > 0
    assert optimizer_state_bytes(opt) == everything - paged


def test_the_hook_publishes_managed_memory_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    model, opt, paged = _paged_optimizer()
    stats = nested_stats(10 * MIB, 12 * MIB, reserved=16 * MIB)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device=None: dict(stats))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 10 * MIB)
    # a CPU model measured as if on cuda:0 (the allocator's figures are the ones above); the host's clock
    tracker = anatomy.Tracker(
        model,
        opt,
        publish=False,
        memory_backend=lambda device, guard: CudaBackend(CudaAllocator(torch.device("cuda", 0)), guard),
    )
    for _ in range(2):
        with tracker.step():
            model(torch.randn(4, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
    snap = tracker.latest
    tracker.close()
    assert snap is not None and snap.cuda is not None
    assert snap.cuda.managed == paged
    assert snap.memory["optimizer_states"] == optimizer_state_bytes(opt)  # without the paged buffers
    decoded = protocol.decode(protocol.encode(snap))
    assert isinstance(decoded, protocol.Snapshot) and decoded.cuda is not None
    assert decoded.cuda.managed == paged


def _snapshot(managed: int) -> protocol.Snapshot:
    at_peak = {"weights": 4 * MIB, "optimizer_states": 8 * MIB, "gradients": 4 * MIB, "activations": 20 * MIB}
    at_peak.update(temporaries=2 * MIB, unattributed=0)
    peak = sum(at_peak.values())
    cuda = CudaMemory(
        allocated=16 * MIB,
        reserved=peak + 6 * MIB,
        peak_allocated=peak,
        alloc_retries=0,
        ooms=0,
        managed=managed,
    )
    memory: dict[str, int | None] = {c.value: None for c in Component}
    memory.update(at_peak)
    return protocol.Snapshot(
        pid=1,
        seq=1,
        time=1.0,
        step=3,
        memory=memory,
        expected_bytes_per_param={},
        parameter_count=1_000_000,
        peak_bytes=peak,
        peak_phase="backward",
        cuda=cuda,
        at_peak=dict(at_peak),
        at_peak_step=3,
    )


def test_the_monitor_takes_managed_memory_out_of_the_cuda_context() -> None:
    managed = 48 * MIB
    snap = _snapshot(managed)
    assert snap.cuda is not None
    nvml = snap.cuda.reserved + 500 * MIB + managed
    rec = reconcile(None, snap, nvml)
    context = rec.row(Component.CUDA_CONTEXT)
    assert context is not None and context.bytes == 500 * MIB
    assert rec.managed_bytes == managed and rec.reconciles
    assert rec.accounted == nvml and rec.unexplained == 0
    assert reconciled_dict(rec)["managed_bytes"] == managed
    # managed pages not resident on the GPU are not in NVML's figure: no more is taken out than it leaves
    short = reconcile(None, snap, snap.cuda.reserved + 10 * MIB)
    assert short.managed_bytes == 10 * MIB and short.row(Component.CUDA_CONTEXT).bytes == 0  # type: ignore[union-attr]
    # without a paged optimizer nothing changes
    plain = reconcile(None, replace(snap, cuda=replace(snap.cuda, managed=0)), nvml)
    assert plain.managed_bytes == 0 and plain.row(Component.CUDA_CONTEXT).bytes == 500 * MIB + managed  # type: ignore[union-attr]


def test_an_older_hooks_cuda_figures_without_managed_still_decode() -> None:
    d = protocol.to_dict(_snapshot(0))
    del d["cuda"]["managed"]  # what a hook before this field sends
    decoded = protocol.from_dict(d)
    assert isinstance(decoded, protocol.Snapshot) and decoded.cuda is not None
    assert decoded.cuda.managed == 0


# -- the resting runs, on the CPU ----------------------------------------------------------------------------


@pytest.fixture
def short_resting_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from anatomy.gpucheck import resting as gpu_resting

    monkeypatch.setattr(gpu_resting, "STEPS", 20)
    monkeypatch.setattr(gpu_resting, "ACCUMULATED_STEPS", 8)


@pytest.mark.usefixtures("short_resting_runs", "nothing_compiled")
def test_the_resting_runs_pass_where_steps_rest_as_they_are_built() -> None:
    from anatomy.gpucheck.resting import CHECKS, check_resting

    verdicts = check_resting(torch.device("cpu"))
    assert [(x.workload, x.check) for x in verdicts] == [
        (w, c) for w in ("mlp-resting", "mlp-accumulate-4") for c in CHECKS
    ]
    assert all(x.status == v.PASS for x in verdicts), v.table(verdicts)
    counts = [x.detail.split()[:3] for x in verdicts if x.check == "ordinary steps rested"]
    assert all(" ms, every step built " in x.detail for x in verdicts if x.check == "ordinary steps rested")
    assert [int(n) for n, _, _ in counts] >= [15, 24] and [int(m) for _, _, m in counts] == [20, 32]


@pytest.mark.usefixtures("short_resting_runs", "nothing_compiled")
def test_the_resting_runs_fail_where_a_resting_step_publishes_another_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from anatomy.gpucheck.resting import check_resting
    from anatomy.hook.ordinary import OrdinarySteps

    real = OrdinarySteps._end_ordinary

    def off_by_one(self: Any, index: int, *args: Any) -> bool:
        resting = len(args) == 14 and args[13]  # (its last argument)
        return real(self, index + 1 if resting else index, *args)

    monkeypatch.setattr(OrdinarySteps, "_end_ordinary", off_by_one)
    verdicts = {(x.workload, x.check): x for x in check_resting(torch.device("cpu"))}
    same = verdicts[("mlp-resting", "resting steps = every step built")]
    assert same.status == v.FAIL and "differs in step" in same.detail


@pytest.mark.usefixtures("short_resting_runs", "nothing_compiled")
def test_the_resting_runs_fail_where_no_step_rests(monkeypatch: pytest.MonkeyPatch) -> None:
    from anatomy.gpucheck.resting import check_resting
    from anatomy.hook.resting import RestingSteps

    monkeypatch.setattr(RestingSteps, "_rest_allow", lambda self, rec: None)  # (the gate never opens)
    verdicts = check_resting(torch.device("cpu"))
    assert [x.status for x in verdicts if x.check == "ordinary steps rested"] == [v.FAIL, v.FAIL]
    assert all(x.status == v.PASS for x in verdicts if x.check != "ordinary steps rested")
