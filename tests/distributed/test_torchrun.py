"""Real multi-process jobs under torchrun (gloo on CPU): DDP, DDP with gradient_as_bucket_view, FSDP2. Each
rank publishes through the hook; the test reads every rank's socket with the monitor's own AnatomySource
and compares what each rank published with the truth that rank counted itself from its tensors
(tests/distributed/dist_train.py): weights, gradients and optimizer states within 0.1 %, activations within
2 %, FSDP2's all-gathered parameters and DDP's buckets named. The same FSDP2 job without the hook trains
to the same losses."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from anatomy.vocabulary import Component
from tui.sources.anatomy_source import LIVE, AnatomySource, TrainingProcess

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SCRIPT = HERE / "dist_train.py"
STEPS = 4
NPROC = 2


@dataclass
class Job:
    mode: str
    truths: dict[int, dict[str, Any]]
    published: dict[int, TrainingProcess]
    log: str
    once_text: str = ""
    once_json: dict[str, Any] | None = None
    records: Path | None = None  # the ranks' flight-recorder files (kept after the job)


def _wait(predicate: Any, timeout: float, step: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return bool(predicate())


def run_job(mode: str, hook: bool = True, model: str = "net") -> Job:
    base = Path(tempfile.mkdtemp(prefix="tr-", dir="/tmp"))
    runtime, out = base / "run", base / "out"
    runtime.mkdir(mode=0o700)
    log_path = base / "log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANATOMY_TOP")}
    records = Path(tempfile.mkdtemp(prefix="tr-records-", dir="/tmp"))
    env.update(ANATOMY_TOP_DIR=str(runtime), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.update(ANATOMY_TOP_RECORD=str(records))
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}"]
    args += [str(SCRIPT), "--mode", mode, "--out", str(out), "--steps", str(STEPS)]
    args += [] if hook else ["--no-hook"]
    args += ["--model", model]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        done = _wait(
            lambda: all((out / f"truth-{r}.json").exists() for r in range(NPROC)) or proc.poll() is not None,
            180,
        )
        text = log_path.read_text(errors="replace")
        assert done and proc.poll() is None, f"the {mode} job did not finish its steps:\n{text[-4000:]}"
        truths = {r: json.loads((out / f"truth-{r}.json").read_text()) for r in range(NPROC)}
        published: dict[int, TrainingProcess] = {}
        if hook:
            with AnatomySource(runtime) as source:

                def all_ranks_final() -> bool:
                    for p in source.poll(wait_for_first_s=0.5):
                        if p.hello is not None and p.snapshot is not None and p.snapshot.step >= STEPS - 1:
                            published[p.hello.rank if p.hello.rank is not None else -1] = p
                    return len(published) == NPROC

                assert _wait(all_ranks_final, 30), f"published: {published}\n{log_path.read_text()[-3000:]}"
        once_text, once_json = "", None
        if hook and model == "net":  # what `anatomy-top --once [--json]` shows of the job's live ranks
            cmd = [sys.executable, "-m", "tui.cli", "--once"]
            text = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
            doc = subprocess.run(
                [*cmd, "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
            )
            assert text.returncode == 0 and doc.returncode == 0, text.stderr + doc.stderr
            once_text, once_json = text.stdout, json.loads(doc.stdout)
        (out / "stop").touch()
        assert proc.wait(timeout=60) == 0, log_path.read_text(errors="replace")[-4000:]
        log_text = log_path.read_text(errors="replace")
        return Job(mode, truths, published, log_text, once_text, once_json, records)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def jobs() -> Iterator[dict[str, Job]]:
    cache: dict[str, Job] = {}

    class Lazy(dict):  # type: ignore[type-arg]
        def __missing__(self, mode: str) -> Job:
            cache[mode] = run_job(mode)
            return cache[mode]

    yield Lazy()


def _close(published: int | None, truth: int, rel: float) -> bool:
    return published is not None and abs(published - truth) <= rel * max(truth, 1)


def _check_model_state(job: Job) -> None:
    for rank, truth in job.truths.items():
        proc = job.published[rank]
        mem = proc.snapshot.memory if proc.snapshot is not None else {}
        assert proc.state == LIVE and proc.pid == truth["pid"]
        for key in ("weights", "gradients", "optimizer_states"):
            assert _close(mem.get(key), truth[key], 0.001), (job.mode, rank, key, mem.get(key), truth[key])
        assert _close(mem.get(Component.ACTIVATIONS.value), truth["activations"], 0.02), (
            job.mode,
            rank,
            mem.get(Component.ACTIVATIONS.value),
            truth["activations"],
        )


def _check_group(job: Job) -> None:
    hellos = [p.hello for p in job.published.values()]
    assert all(h is not None for h in hellos)
    assert sorted(h.rank for h in hellos if h is not None) == list(range(NPROC))
    assert {h.world_size for h in hellos if h is not None} == {NPROC}
    assert {h.local_world_size for h in hellos if h is not None} == {NPROC}
    run_ids = {h.run_id for h in hellos if h is not None}
    assert len(run_ids) == 1 and None not in run_ids  # torchrun's run id, shared by the ranks
    assert len({p.rank_group for p in job.published.values()}) == 1
    assert {h.model_class for h in hellos if h is not None} == {"Net"}  # not the wrapper's class


def test_ddp_ranks_publish_what_each_holds(jobs: dict[str, Job]) -> None:
    job = jobs["ddp"]
    _check_model_state(job)
    _check_group(job)
    for rank, truth in job.truths.items():
        mem = job.published[rank].snapshot.memory  # type: ignore[union-attr]
        # DDP keeps a second copy of the gradients in its buckets for the all-reduce: named, not unattributed
        assert mem.get(Component.COMMUNICATION_BUFFERS.value) == truth["ddp_buckets"] > 0
        assert truth["weights"] == truth["gradients"]  # DDP replicates: every rank holds the whole model


def test_ddp_bucket_views_are_gradients_counted_once(jobs: dict[str, Job]) -> None:
    job = jobs["ddp-bucket-view"]
    _check_model_state(job)
    for rank, truth in job.truths.items():
        mem = job.published[rank].snapshot.memory  # type: ignore[union-attr]
        assert truth["gradients"] == truth["ddp_buckets"]  # the gradients live in the buckets
        assert mem.get(Component.COMMUNICATION_BUFFERS.value) is None  # so no second row for them


def test_fsdp2_ranks_publish_their_shards(jobs: dict[str, Job]) -> None:
    job = jobs["fsdp2"]
    _check_model_state(job)
    _check_group(job)
    for rank, truth in job.truths.items():
        proc = job.published[rank]
        mem = proc.snapshot.memory  # type: ignore[union-attr]
        assert proc.error is None and (proc.snapshot is not None and proc.snapshot.error is None)
        # each rank holds its shard: about 1/N of the model (shards are padded to equal sizes)
        full = truth["full_parameter_count"] * 4
        assert full / NPROC <= mem["weights"] <= full / NPROC * 1.02
        assert mem.get(Component.UNSHARDED_PARAMETERS.value) == truth["unsharded_after_forward"]
        # parameters counted as held (the local shard), so bytes per parameter stay fp32's 4.00
        assert proc.hello is not None and proc.hello.parameter_count == truth["parameter_count"]
        assert proc.snapshot is not None and proc.snapshot.at_peak is not None
        at_peak = proc.snapshot.at_peak
        assert at_peak[Component.UNSHARDED_PARAMETERS.value] == truth["unsharded_after_forward"]
        assert sum(v or 0 for v in at_peak.values()) == proc.snapshot.peak_bytes  # still adds up


def test_the_hook_does_not_change_fsdp2_training(jobs: dict[str, Job]) -> None:
    with_hook = jobs["fsdp2"]
    without = run_job("fsdp2", hook=False)
    for rank in range(NPROC):
        assert with_hook.truths[rank]["losses"] == without.truths[rank]["losses"]
        for key in ("weights", "gradients", "optimizer_states", "activations"):
            assert with_hook.truths[rank][key] == without.truths[rank][key]


def test_the_monitor_groups_the_ranks_of_a_job(jobs: dict[str, Job]) -> None:
    job = jobs["ddp"]
    assert job.once_json is not None
    (entry,) = job.once_json["jobs"]
    assert entry["world_size"] == NPROC and entry["model_class"] == "Net" and entry["run_id"]
    ranks = {r["rank"]: r for r in entry["ranks"]}
    assert sorted(ranks) == list(range(NPROC))
    for rank, truth in job.truths.items():
        assert ranks[rank]["pid"] == truth["pid"]
        assert _close(ranks[rank]["memory"]["weights"], truth["weights"], 0.001)
    # the job's total is the sum of its ranks, component by component
    for key in ("weights", "gradients", "optimizer_states", "activations", "communication_buffers"):
        assert entry["total"]["memory"][key] == sum(r["memory"][key] for r in entry["ranks"])
    step_times = {r["rank"]: r["step_s"] for r in entry["ranks"]}
    assert entry["slowest_rank"] == max(step_times, key=lambda k: step_times[k])
    assert f"Job Net: {NPROC} of {NPROC} ranks on this node (run {entry['run_id']})" in job.once_text
    assert f"Rank {entry['slowest_rank']} is the" in job.once_text


def test_the_report_of_a_job_is_one_page_with_both_ranks(jobs: dict[str, Job], tmp_path: Path) -> None:
    job = jobs["ddp"]
    assert job.records is not None
    listed = subprocess.run(
        [sys.executable, "-m", "tui.cli", "runs", "--json", "--dir", str(job.records)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (entry,) = json.loads(listed.stdout)  # the two ranks' files are one run
    assert entry["ranks"] == NPROC and entry["model_class"] == "Net" and entry["ended"] == "finished"
    assert sorted(entry["pids"]) == sorted(t["pid"] for t in job.truths.values())
    out = tmp_path / "job.html"
    subprocess.run(
        [sys.executable, "-m", "tui.cli", "report", entry["id"], "--dir", str(job.records), "-o", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    html = out.read_text()
    for rank in range(NPROC):
        assert f'id="memory-r{rank}"' in html and f'id="phases-r{rank}"' in html
        assert f"<td>{rank}</td><td>{job.truths[rank]['pid']}</td>" in html
    # what each rank recorded at its last step is what it published there
    for rank in range(NPROC):
        path = next(p for p in entry["paths"] if f"-r{rank}-" in Path(p).name)
        from anatomy.runs import read_run

        run = read_run(path)
        published = job.published[rank].snapshot
        assert published is not None and run.rank == rank
        assert published in run.snapshots or published.step <= run.snapshots[-1].step
        assert [r.step for r in run.rows] == list(range(len(run.rows))) and len(run.rows) >= STEPS


def test_a_trainer_under_torchrun_publishes_one_socket_per_rank() -> None:
    base = Path(tempfile.mkdtemp(prefix="tt-", dir="/tmp"))
    runtime, out = base / "run", base / "out"
    runtime.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANATOMY_TOP")}
    records = Path(tempfile.mkdtemp(prefix="tr-records-", dir="/tmp"))
    env.update(ANATOMY_TOP_DIR=str(runtime), OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.update(ANATOMY_TOP_RECORD=str(records))
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={NPROC}"]
    args += [str(HERE / "trainer_train.py"), "--out", str(out)]
    log_path = base / "log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        done = _wait(
            lambda: all((out / f"rank-{r}.json").exists() for r in range(NPROC)) or proc.poll() is not None,
            240,
        )
        assert done and proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
        facts = {r: json.loads((out / f"rank-{r}.json").read_text()) for r in range(NPROC)}
        sockets = sorted(runtime.glob("anatomy-*.sock"))
        assert len(sockets) == NPROC  # one socket per rank
        with AnatomySource(runtime) as source:
            shown: dict[int, TrainingProcess] = {}

            def ranks_published() -> bool:
                for p in source.poll(wait_for_first_s=0.5):
                    if p.hello is not None and p.snapshot is not None and p.hello.rank is not None:
                        shown[p.hello.rank] = p
                return len(shown) == NPROC

            assert _wait(ranks_published, 30)
        for rank, fact in facts.items():
            proc_ = shown[rank]
            assert proc_.pid == fact["pid"] and proc_.hello is not None
            assert (
                proc_.hello.model_class == "BertForSequenceClassification" and proc_.hello.world_size == NPROC
            )
            assert proc_.snapshot is not None and proc_.snapshot.memory["weights"] == fact["weights"]
        assert len({p.rank_group for p in shown.values()}) == 1
        (out / "stop").touch()
        assert proc.wait(timeout=60) == 0, log_path.read_text(errors="replace")[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(base, ignore_errors=True)
