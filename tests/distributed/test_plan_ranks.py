"""`anatomy-top plan --fsdp 2` and `--ddp 2` for rank 0 against what rank 0 of a real 2-rank torchrun job
(gloo on CPU) published through the hook: a tiny Llama from tests/distributed/tiny_llama, the directory the
plan reads, trained by tests/distributed/dist_train.py --model llama. Weights, gradients and optimizer states
are exact (FSDP2's padded shards, DDP's replicas); the step's tensor peak within 5 % (the hook's peak without
what the process holds besides the training tensors: its runtime and unattributed rows)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest

from anatomy.vocabulary import Component
from tests.distributed.dist_train import CONFIG_DIR, SEQ_LEN
from tests.distributed.test_torchrun import NPROC, STEPS, Job, run_job

pytestmark = pytest.mark.slow

BATCH = 8  # dist_train.py's default --batch
OUTSIDE = (Component.RUNTIME.value, Component.UNATTRIBUTED.value)


@pytest.fixture(scope="module")
def llama_jobs() -> Iterator[dict[str, Job]]:
    cache: dict[str, Job] = {}

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, mode: str) -> Job:
            cache[mode] = run_job(mode, model="llama")
            return cache[mode]

    yield Lazy()


def _plan(kind: str) -> Any:
    from anatomy.plan import Planner, PlanSettings, load_config
    from anatomy.plan.sharding import rank_plan

    planner = Planner(load_config(str(CONFIG_DIR)))
    sizes = {"fsdp": (NPROC,), "ddp": ()} if kind == "fsdp" else {"fsdp": (), "ddp": (NPROC,)}
    settings = PlanSettings(batch_size=BATCH, seq_len=SEQ_LEN, target="cpu", padded=False, **sizes)
    return rank_plan(planner, settings, kind, NPROC)


def _compare(kind: str, job: Job) -> None:
    plan = _plan(kind)
    snap = job.published[0].snapshot
    assert snap is not None and snap.at_peak is not None and snap.peak_bytes is not None
    for comp in (Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES):
        assert plan.components[comp] == snap.memory[comp.value] == job.truths[0][comp.value], comp
    measured_peak = snap.peak_bytes - sum(snap.at_peak.get(c) or 0 for c in OUTSIDE)
    assert plan.peak_bytes == pytest.approx(measured_peak, rel=0.05), (plan.peak_bytes, measured_peak)
    # The table a user reads (printed with -s: the figures of the closing note).
    from anatomy.plan.rank_report import render_ranks

    text = io.StringIO()
    render_ranks([plan], text)
    print(f"\n{kind} {NPROC}: plan vs rank 0 published\n{text.getvalue()}")
    for comp in Component:
        planned, published = plan.components.get(comp), snap.memory.get(comp.value)
        if planned is not None or published is not None:
            print(f"  {comp.value:<24}{planned!s:>12}{published!s:>12}")
    print(f"  {'peak (tensors)':<24}{plan.peak_bytes:>12}{measured_peak:>12}")


def test_fsdp2_plan_for_rank_0_matches_what_it_published(llama_jobs: dict[str, Job]) -> None:
    job = llama_jobs["fsdp2"]
    _compare("fsdp", job)
    # the shards are padded as FSDP2 pads them: rank 0 holds ceil(dim0 / N) rows of the 1001-token embedding
    assert job.truths[0]["weights"] < job.truths[0]["full_parameter_count"] * 4 / NPROC * 1.01


def test_ddp_plan_for_rank_0_matches_what_it_published(llama_jobs: dict[str, Job]) -> None:
    job = llama_jobs["ddp"]
    _compare("ddp", job)
    plan = _plan("ddp")
    snap = job.published[0].snapshot
    assert snap is not None
    buckets = snap.memory[Component.COMMUNICATION_BUFFERS.value]
    assert plan.components[Component.COMMUNICATION_BUFFERS] == buckets == job.truths[0]["ddp_buckets"]


def test_fsdp2_llama_ranks_publish_the_activations_and_gathered_parameters_they_hold(
    llama_jobs: dict[str, Job],
) -> None:
    """Against the rank's own count (dist_train.py): the storages its forward saved for backward, seen by a
    user's saved_tensors_hooks, and the gathered parameters FSDP2 still holds as the forward returns (the
    root's: embedding, final norm, head — the embedding's weight is not among what the forward saves).
    FSDP frees each layer's gathered parameters after its forward and the allocator hands their addresses
    to later activations: those must count as activations. The steps before the last (counted by the hook
    without a user's hooks, whose forward window stays open for the loss) are checked in the flight
    record: the same figures, every step having the same shapes."""
    from anatomy.runs import read_run

    job = llama_jobs["fsdp2"]
    assert job.records is not None
    for rank, truth in job.truths.items():
        snap = job.published[rank].snapshot
        assert snap is not None and snap.at_peak is not None
        assert truth["unsharded_after_forward"] > 0 and truth["activations"] > 0
        assert snap.memory[Component.ACTIVATIONS.value] == truth["activations"], rank
        assert snap.memory[Component.UNSHARDED_PARAMETERS.value] == truth["unsharded_after_forward"], rank
        assert snap.at_peak[Component.UNSHARDED_PARAMETERS.value] == truth["unsharded_after_forward"], rank
        (path,) = [p for p in job.records.rglob("*") if p.is_file() and f"-r{rank}-" in p.name]
        earlier = [s for s in read_run(path).snapshots if s.step < STEPS - 1]
        assert earlier, "no snapshot of the steps counted without the user's hooks"
        for s in earlier:
            assert s.memory[Component.ACTIVATIONS.value] == truth["activations"], (rank, s.step)
            assert s.memory[Component.UNSHARDED_PARAMETERS.value] == truth["unsharded_after_forward"], (
                rank,
                s.step,
            )
