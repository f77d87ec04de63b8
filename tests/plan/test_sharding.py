"""One rank of a data-parallel job (anatomy.plan.sharding) against each implementation's own arithmetic:
DDP's bucket assignment (torch's reducer function itself), DeepSpeed's ZeRO partitioning and memory
estimators, FSDP2's dim-0 chunking (torch.chunk); and bad input refused before torch is imported. The real
2-rank FSDP2 and DDP jobs are compared in tests/distributed/test_plan_ranks.py."""

from __future__ import annotations

import copy
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from anatomy import plan_cli
from anatomy.plan import Planner, PlanSettings
from anatomy.plan.settings import Target
from anatomy.plan.sharding import (
    DDP_BUCKET_CAP_BYTES,
    DDP_FIRST_BUCKET_BYTES,
    ddp_buckets,
    fsdp_states,
    layout_of,
    rank_plan,
    shard_shape,
    zero_partition,
    zero_states,
)
from anatomy.plan.states import ParamShape
from anatomy.vocabulary import Component

REPO = Path(__file__).resolve().parents[2]


def _llama(tiny_configs: dict[str, Any], **changes: Any) -> Any:
    from transformers import AutoModelForCausalLM

    cfg = copy.deepcopy(tiny_configs["llama"])  # the fixture is the session's: change a copy
    for k, v in changes.items():
        setattr(cfg, k, v)
    return AutoModelForCausalLM.from_config(cfg)


def test_ddp_buckets_are_the_reducers_assignment(tiny_configs: dict[str, Any]) -> None:
    # wide enough for several buckets past the first 1 MiB one
    model = _llama(
        tiny_configs, hidden_size=512, intermediate_size=2048, vocab_size=1000, num_hidden_layers=6
    )
    params = [p for p in model.parameters() if p.requires_grad]
    shapes = tuple(ParamShape(tuple(p.shape), p.element_size()) for p in params)
    rev = list(reversed(params))
    # DDP's Reducer assigns its buckets here; torch has no public way to ask it (it is what we model).
    indices, _ = torch.distributed._compute_bucket_assignment_by_size(
        rev, [DDP_FIRST_BUCKET_BYTES, DDP_BUCKET_CAP_BYTES], [False] * len(rev), list(range(len(rev)))
    )
    theirs = sorted(sum(rev[i].numel() * rev[i].element_size() for i in bucket) for bucket in indices)
    mine = ddp_buckets(shapes)
    assert sorted(mine) == theirs and len(mine) > 2, (mine, theirs)


def test_fsdp_shards_are_rank_0s_padded_chunks(tiny_configs: dict[str, Any]) -> None:
    model = _llama(tiny_configs, vocab_size=1001)
    for p in model.parameters():
        for n in (2, 3, 8):
            chunk0 = torch.chunk(p.detach(), n, dim=0)[
                0
            ]  # FSDP2 shards with torch.chunk; rank 0's is largest
            assert shard_shape(ParamShape(tuple(p.shape), 4), n).shape == tuple(chunk0.shape)
    layout = layout_of(model, 0)
    assert (
        layout.block_class == "LlamaDecoderLayer" and len(layout.groups) == 1 + model.config.num_hidden_layers
    )
    rs = fsdp_states(layout, 4, "adamw", Target.CPU)
    shard_bytes = sum(torch.chunk(p, 4, dim=0)[0].numel() * 4 for p in model.parameters())
    assert rs.weights == rs.gradients == shard_bytes
    assert rs.optimizer_states == 2 * shard_bytes + 4 * len(list(model.parameters()))


@pytest.mark.parametrize("n", [2, 4, 8, 64])
def test_zero_partitions_and_states_are_deepspeeds(tiny_configs: dict[str, Any], n: int) -> None:
    from deepspeed.runtime.utils import align_dense_tensors
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs, model_to_params
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    model = _llama(tiny_configs, vocab_size=1001)
    params = list(model.parameters())
    padded = sum(t.numel() for t in align_dense_tensors(params, 2 * n))  # DeepSpeed's flat, aligned buffer
    total, largest = model_to_params(model)
    assert zero_partition(total, n) == padded // n
    layout = layout_of(model, 0)
    assert layout.largest_module == largest
    part = padded // n

    def states(stage: int) -> int:
        rs = zero_states(layout, n, stage, "adamw", True, Target.CUDA)
        gathered = rs.unsharded_peak
        return rs.weights + rs.gradients + rs.optimizer_states + gathered

    # DeepSpeed's estimators (no offload), with its partitions padded as its optimizer pads them
    _, ds2 = estimate_zero2_model_states_mem_needs(padded, num_gpus_per_node=n, cpu_offload=False)
    assert states(2) == ds2 - 2 * (padded - total)  # DeepSpeed keeps the unpadded 16-bit weights
    _, ds3, _ = estimate_zero3_model_states_mem_needs(
        padded, largest, num_gpus_per_node=n, cpu_offload=False, cpu_offload_params=False
    )
    assert states(3) == ds3
    # ZeRO-1 keeps the whole 16-bit gradients: the paper's 2 + 2 + K/N (K: fp32 master, moments, grads)
    assert states(1) == 2 * total + 2 * total + 16 * part


def test_fsdp_plan_shrinks_with_world_size(tiny_configs: dict[str, Any]) -> None:
    planner = Planner(tiny_configs["llama"], "causal-lm")
    settings = PlanSettings(batch_size=2, seq_len=32, target="cpu", fsdp=(2, 4))
    two, four = (rank_plan(planner, settings, "fsdp", n) for n in (2, 4))
    base = planner.plan(settings)
    for comp in (Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES):
        assert base.components[comp] > (two.components[comp] or 0) > (four.components[comp] or 0)
    assert two.components[Component.ACTIVATIONS] == base.components[Component.ACTIVATIONS]
    assert two.components[Component.UNSHARDED_PARAMETERS]


def _bert_dir(tmp_path: Path, tiny_configs: dict[str, Any]) -> Path:
    cfg = tiny_configs["bert"]
    cfg.architectures = ["BertForSequenceClassification"]
    cfg.save_pretrained(tmp_path / "tiny-bert")
    return tmp_path / "tiny-bert"


def test_cli_shows_a_column_per_world_size(tmp_path: Path, tiny_configs: dict[str, Any]) -> None:
    model = str(_bert_dir(tmp_path, tiny_configs))
    out, err = io.StringIO(), io.StringIO()
    argv = [model, "--batch-size", "2", "--seq-len", "32", "--gpu", "A100-40GB", "--fsdp", "2,4,8", "--quick"]
    assert plan_cli.main(argv, out=out, err=err) == 0, err.getvalue()
    text = out.getvalue()
    header = next(line for line in text.splitlines() if "N=2" in line)
    assert "N=4" in header and "N=8" in header
    assert "One rank of FSDP2" in text and max(len(line) for line in text.splitlines()) <= 80
    out = io.StringIO()
    argv = [
        model,
        "--batch-size",
        "2",
        "--seq-len",
        "32",
        "--zero",
        "3",
        "--world-size",
        "2,4",
        "--json",
        "--quick",
    ]
    assert plan_cli.main(argv, out=out, err=err) == 0, err.getvalue()
    ranks = json.loads(out.getvalue())["ranks"]
    assert [(r["kind"], r["world_size"]) for r in ranks] == [("zero3", 2), ("zero3", 4)]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--fsdp", "0"], "--fsdp 0: a world size is a whole number"),
        (["--ddp", "2,0"], "--ddp 0: a world size"),
        (["--zero", "4", "--world-size", "8"], "--zero 4: DeepSpeed's ZeRO stages are 1, 2 and 3"),
        (["--zero", "2"], "--zero needs --world-size"),
        (["--world-size", "4"], "--world-size applies to --zero"),
        (["--fsdp", "two"], "'two' is not a world size"),
    ],
)
def test_bad_sharding_input_is_one_line_before_torch(extra: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    code = (
        "import sys; from anatomy import plan_cli; rc = plan_cli.main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), *extra],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
