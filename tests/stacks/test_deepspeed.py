"""DeepSpeed ZeRO stages 1-3 on CPU (its CPU accelerator, gloo, one rank): what the hook names against an
independent count of DeepSpeed's own tensors made in the training process (tests/stacks/deepspeed_train.py),
and the losses with and without the hook.

Three training jobs run side by side: ``deepspeed.initialize`` with stage 1 in bf16, stage 2 in fp32 and
stage 3 in bf16 (a torch AdamW with two parameter groups), and stage 2 in bf16 with DeepSpeed's
``gradient_accumulation_steps=2``; the Hugging Face Trainer with ``TrainingArguments(deepspeed=config)`` at
stage 2 in bf16 (tiny Llama from a config), without and with ``gradient_accumulation_steps=2``; and stage 3 in
bf16 on
two ranks under torchrun (partitioned parameters, all-gathered for the forward). Each starts with an
empty ``TORCH_EXTENSIONS_DIR``: nothing depends on a JIT-built DeepSpeed op.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from anatomy.hook import zero as zero_opt

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("deepspeed_train.py")
# "2ga": stage 2 with gradient_accumulation_steps=2 (the tracker's step around every micro-batch)
INITIALIZE = ["1-bf16", "2-fp32", "3-bf16", "2ga-bf16"]
TRAINER = ["trainer2-bf16", "trainer2ga-bf16"]
RANKS = ["3-bf16"]  # under torchrun, two ranks
ADAMW_BYTES = 8.0  # the guide's AdamW states per parameter
MASTER_BYTES = 4.0  # the guide's fp32 master copy per parameter


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(args: list[str], tmp: Path, ranks: int = 1) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(ROOT),
        MASTER_PORT=str(_free_port()),
        TORCH_EXTENSIONS_DIR=str(tmp),
        ANATOMY_TOP_DIR=str(tmp / "run"),
        OMP_NUM_THREADS="1",
    )
    env.pop("ANATOMY_TOP", None)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    return subprocess.Popen(
        [*(launcher if ranks > 1 else [sys.executable]), str(WORKER), *args],
        env=env,
        cwd=str(tmp),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _collect(proc: subprocess.Popen[str], directory: Path, ranks: int = 1) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=240)
    files = sorted(directory.glob("result-*.json"))  # one per rank, written by the rank itself
    assert proc.returncode == 0 and len(files) == ranks, out[-4000:]
    result: dict[str, Any] = {}
    for file in files:
        result.update(json.loads(file.read_text()))
    return result


@pytest.fixture(scope="module")
def deepspeed_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three training jobs, started together (each is mostly waiting on its own imports)."""
    tmp = tmp_path_factory.mktemp("deepspeed")
    for sub in ("a", "b", "c"):
        (tmp / sub).mkdir()

    def args(keys: list[str]) -> list[str]:
        return [part for key in keys for part in key.split("-")]

    jobs = [(args(INITIALIZE), tmp / "a", 1), (args(TRAINER), tmp / "b", 1), (args(RANKS), tmp / "c", 2)]
    procs = [(_launch(argv, directory, ranks=ranks), directory, ranks) for argv, directory, ranks in jobs]
    results: dict[str, Any] = {}
    for proc, directory, ranks in procs:
        results.update(_collect(proc, directory, ranks))
    return results


ALL = INITIALIZE + TRAINER + [f"{k}@{r}" for k in RANKS for r in (0, 1)]


@pytest.mark.parametrize("key", ALL)
def test_losses_identical_with_and_without_the_hook(deepspeed_runs: dict[str, Any], key: str) -> None:
    run = deepspeed_runs[key]
    # one loss per micro-batch with deepspeed.initialize, one per logged update with the Trainer
    assert len(run["losses"]) == 4 * (1 if key.startswith("trainer") else run["accum"])
    assert run["losses"] == run["plain_losses"]


@pytest.mark.parametrize("key", ALL)
def test_weights_gradients_and_optimizer_states_match_deepspeeds_tensors(
    deepspeed_runs: dict[str, Any], key: str
) -> None:
    run = deepspeed_runs[key]
    hook, independent = run["hook"], run["independent"]
    assert run["error"] is None
    assert run["steps"] == 4  # one published step per engine.step()
    assert hook["weights"] == independent["weights"]
    # Optimizer states: torch's moments and step counters plus DeepSpeed's fp32 master partitions, each
    # storage once (the masters are the states' keys: counted once, as states).
    assert independent["optimizer_states"] == independent["moments"] + independent["masters"]
    assert hook["optimizer_states"] == independent["optimizer_states"]
    # Gradients: DeepSpeed's buffers as the ZeRO step begins (param.grad is never set).
    assert run["gradients"] > 0
    assert hook["gradients"] == run["gradients"]


@pytest.mark.parametrize("key", ALL)
def test_bytes_per_parameter_follow_deepspeeds_layout(deepspeed_runs: dict[str, Any], key: str) -> None:
    run = deepspeed_runs[key]
    params = run["parameter_count"]
    bf16 = "bf16" in key
    itemsize = 2 if bf16 else 4
    ranks = run.get("world_size", 1)
    stage3 = key.split("-")[0].endswith("3")
    assert run["precision"] == ("bf16_mixed" if bf16 else "fp32")
    # stage 3: the rank's partition of every parameter; stages 1-2: whole parameters
    assert params == (run["numel"] // ranks if stage3 else run["numel"])
    # states and reduced gradients partitioned over the ranks in stages 1-2 (their parameters whole)
    split = 1 if stage3 else ranks
    # fp32 masters of the rank's partition: 4 B/param
    assert abs(run["independent"]["masters"] / params - MASTER_BYTES / split) < 0.02
    expected = run["expected"]
    assert expected["optimizer_states"] == (ADAMW_BYTES + MASTER_BYTES) / split
    assert expected["weights"] == itemsize
    assert expected["gradients"] == itemsize / split
    measured = run["hook"]["optimizer_states"] / params
    assert abs(measured - expected["optimizer_states"]) < 0.02  # + AdamW's step counters, alignment padding
    assert abs(run["hook"]["gradients"] / params - expected["gradients"]) < 0.02
    # weights are the bit16 parameters (+ the model's buffers), not 6 B/param
    assert abs(run["hook"]["weights"] / params - itemsize) < 0.01


def test_stage3_gathered_parameters_are_not_activations(deepspeed_runs: dict[str, Any]) -> None:
    """Two ranks: ZeRO-3 all-gathers each parameter for its module's forward, and the forward saves the
    gathered weights for backward. The activations are the same as on one rank (same model, same batch);
    the gathered weights are unsharded parameters, not activations."""
    one = deepspeed_runs["3-bf16"]["hook"]["activations"]
    for rank in (0, 1):
        hook = deepspeed_runs[f"3-bf16@{rank}"]["hook"]
        assert hook["activations"] == one
        assert hook["unsharded_parameters"] is not None


@pytest.mark.parametrize("key", ALL)
def test_reduction_buckets_are_named_where_they_stay(deepspeed_runs: dict[str, Any], key: str) -> None:
    run = deepspeed_runs[key]
    hook = run["hook"]
    if key.split("-")[0].endswith("3"):
        # stage 3 keeps its reduction bucket (reduce_bucket_size elements) between steps
        assert run["independent"]["buckets"] > 0
        assert hook["communication_buffers"] == run["independent"]["buckets"]
        assert hook["runtime"] < run["independent"]["buckets"]  # not hidden in the runtime baseline
    else:
        # stages 1-2 allocate it for each backward and drop it: no row, backward's temporaries hold it
        assert run["independent"]["buckets"] == 0
        assert hook["communication_buffers"] is None
        assert hook["temporaries"] >= run.get("reduce_bucket_bytes", 10**9)


@pytest.mark.parametrize("key", ["2ga-bf16", "trainer2ga-bf16"])
def test_gradient_accumulation_publishes_one_step_per_update(
    deepspeed_runs: dict[str, Any], key: str
) -> None:
    """DeepSpeed's gradient_accumulation_steps=2: the ZeRO optimizer steps on every second micro-batch. The
    published steps are its updates (counted in the training process: engine boundaries, or calls of the
    ZeRO optimizer's step under the Trainer), grad_accum_steps the micro-batches of one; the gradients
    (DeepSpeed's buffers as its step begins) and optimizer states stay exact on every step's figure —
    also on a step the hook does not re-sum (the Trainer's on_pre_optimizer_step comes after the engine's
    update there: its buffers are empty then)."""
    run = deepspeed_runs[key]
    assert run["accum"] == 2 and run["error"] is None
    assert run["updates"] == 4 and run["steps"] == run["updates"]
    if key.startswith("trainer"):
        assert run["global_step"] == run["updates"]
    assert run["micro_batches"] == 2
    assert run["gradients"] > 0 and run["hook"]["gradients"] == run["gradients"]
    assert run["hook"]["optimizer_states"] == run["independent"]["optimizer_states"]


def test_the_trainer_run_steps_two_parameter_groups(deepspeed_runs: dict[str, Any]) -> None:
    run = deepspeed_runs["trainer2-bf16"]
    assert run["groups"] == 2
    assert run["zero_class"] == "DeepSpeedZeroOptimizer"


# -- the recognition and the step wrapper, without DeepSpeed -------------------------------------------------


def _zero_class() -> type:
    cls = type("DeepSpeedZeroOptimizer", (), {"step": lambda self: "stepped"})
    cls.__module__ = "deepspeed.runtime.zero.stage_1_and_2"
    return cls


def test_find_zero_sees_through_wrappers_and_the_engine() -> None:
    zero = _zero_class()()
    zero.single_partition_of_fp32_groups = [torch.zeros(3)]
    wrapper = SimpleNamespace(optimizer=zero)  # accelerate's DeepSpeedOptimizerWrapper
    engine = SimpleNamespace(optimizer=zero)
    assert zero_opt.find_zero(wrapper) is zero
    assert zero_opt.find_zero(None, engine) is zero
    assert zero_opt.find_zero(torch.optim.SGD([torch.zeros(1, requires_grad=True)])) is None
    plain = type("DeepSpeedZeroOptimizer", (), {})()  # right name, wrong module: not DeepSpeed's
    plain.single_partition_of_fp32_groups = []
    assert zero_opt.find_zero(plain) is None


def test_the_step_wrapper_calls_around_and_gives_back_what_was_there() -> None:
    zero = _zero_class()()
    calls: list[str] = []

    def theirs() -> str:
        calls.append("theirs")
        return type(zero).step(zero)

    zero.step = theirs  # someone else's instance-level wrapper, installed first
    handles = zero_opt.hook_step(zero, lambda *a: calls.append("pre"), lambda *a: calls.append("post"))
    assert zero.step() == "stepped"
    assert calls == ["pre", "theirs", "post"]
    for h in handles:
        h.remove()
    assert zero.step is theirs
    del zero.step
    handles = zero_opt.hook_step(zero, lambda *a: None, lambda *a: None)
    for h in handles:
        h.remove()
    assert "step" not in vars(zero)


def test_state_and_gradient_sums_count_each_storage_once() -> None:
    zero = _zero_class()()
    flat = torch.zeros(10)
    master = torch.zeros(10)
    master.grad = torch.zeros(10)
    zero.single_partition_of_fp32_groups = [master]
    zero.averaged_gradients = {0: [flat[:4], flat[4:]]}  # views of one buffer
    param = torch.zeros(2, requires_grad=True)
    opt = SimpleNamespace(state={master: {"exp_avg": torch.zeros(10), "step": torch.tensor(1.0)}})
    assert zero_opt.state_bytes(opt, zero) == 40 + 4 + 40
    assert zero_opt.gradient_bytes([param], zero) == 40 + 40
    assert zero_opt.stage(zero) == 1
