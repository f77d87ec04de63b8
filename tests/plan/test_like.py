"""`anatomy-top plan --like PID`: the hello's new optional fields (the model's config and the batch shape,
bounded and validated like every field), the settings read from a hello, and plan vs measured on a live CPU
training process with the hook (tui.demo_train)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from anatomy import protocol
from anatomy.plan.like import Measured, settings_like
from anatomy.plan.settings import PlanError, PlanSettings, Target
from anatomy.protocol import MAX_CONFIG_CHARS, Hello, ProtocolError, Snapshot
from anatomy.vocabulary import Component

REPO = Path(__file__).resolve().parents[2]
LLAMA = json.dumps(
    {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "vocab_size": 500,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
)


def _hello(**fields: Any) -> Hello:
    base: dict[str, Any] = dict(
        pid=4242,
        host="h",
        device="cpu",
        precision="fp32",
        optimizer="adamw",
        model_class="LlamaForCausalLM",
        parameter_count=1,
        torch_version="2",
        started_at=1.0,
        optimizer_class="AdamW",
    )
    base.update(fields)
    return Hello(**base)


def _decoded(hello: Hello) -> Hello:
    msg = protocol.decode(protocol.encode(hello).rstrip(b"\n"))
    assert isinstance(msg, Hello)
    return msg


def test_config_and_batch_shape_round_trip() -> None:
    got = _decoded(_hello(model_config=LLAMA, batch_shape=(4, 64)))
    assert got.model_config == LLAMA and got.batch_shape == (4, 64)
    old = _decoded(_hello())  # an older hook's hello: both absent
    assert old.model_config is None and old.batch_shape is None


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("model_config", "x" * (MAX_CONFIG_CHARS + 1), "at most 32 KiB"),
        ("model_config", "[1, 2]", "not a JSON object"),
        ("model_config", "{not json", "not JSON"),
        ("model_config", 7, "JSON object"),
        ("batch_shape", [4, -1], "whole numbers"),
        ("batch_shape", [True, 3], "whole numbers"),
        ("batch_shape", [1] * 9, "more than 8 dimensions"),
        ("batch_shape", "4x64", "expected"),
    ],
)
def test_bad_fields_are_rejected(field: str, value: Any, match: str) -> None:
    d = protocol.to_dict(_hello())
    d[field] = value
    with pytest.raises(ProtocolError, match=match):
        protocol.decode(json.dumps(d).encode())


def _snap(**memory: int | None) -> Snapshot:
    return Snapshot(
        pid=4242,
        time=1.0,
        step=3,
        seq=3,
        memory=dict(memory),
        expected_bytes_per_param={},
        parameter_count=1,
        peak_bytes=10,
    )


def test_settings_from_the_hello() -> None:
    base = PlanSettings(gradient_checkpointing=True)
    config, s = settings_like(Measured(_hello(model_config=LLAMA, batch_shape=(4, 64)), _snap()), base)
    assert config.model_type == "llama" and config.hidden_size == 64
    assert (s.batch_size, s.seq_len, s.target, s.optimizer, s.fsdp, s.ddp) == (
        4,
        64,
        Target.CPU,
        "adamw",
        (),
        (),
    )
    assert s.gradient_checkpointing and s.padded is False  # the command line's; no mask seen
    fsdp = Measured(
        _hello(model_config=LLAMA, batch_shape=(4, 64), world_size=8), _snap(unsharded_parameters=5)
    )
    assert settings_like(fsdp, base)[1].fsdp == (8,)
    ddp = Measured(
        _hello(model_config=LLAMA, batch_shape=(4, 64), world_size=2), _snap(communication_buffers=5)
    )
    assert settings_like(ddp, base)[1].ddp == (2,)
    with pytest.raises(PlanError, match="no Hugging Face config"):
        settings_like(Measured(_hello(batch_shape=(4, 64)), _snap()), base)


def test_like_a_process_nobody_runs_is_one_line(tmp_path: Path) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, ANATOMY_TOP_DIR=str(runtime), PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-m", "anatomy.plan_cli", "--like", "999999"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "publishes no anatomy" in proc.stderr and proc.stderr.count("\n") == 1


@pytest.mark.slow
def test_like_a_live_cpu_job(tmp_path: Path) -> None:
    """A real training process (BERT, the hook publishing): its plan beside what it measured."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    log = tmp_path / "log"
    env = dict(os.environ, ANATOMY_TOP_DIR=str(runtime), PYTHONPATH=str(REPO))
    env.pop("ANATOMY_TOP", None)
    args = ["--batch", "4", "--seq", "32", "--hidden", "128", "--layers", "2", "--vocab", "2000"]
    args += ["--sample-every", "2", "--steps", "6", "--linger", "--interval", "0.1"]
    with open(log, "wb") as out:
        job = subprocess.Popen(
            [sys.executable, "-m", "tui.demo_train", *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "lingering" not in log.read_text(errors="replace"):
            assert job.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.2)
        cmd = [sys.executable, "-m", "anatomy.plan_cli", "--like", str(job.pid)]
        text = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert text.returncode == 0, text.stderr
        print("\n" + text.stdout)  # the closing note's figures (pytest -s)
        doc = subprocess.run([*cmd, "--json"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert doc.returncode == 0, doc.stderr
    finally:
        job.terminate()
        job.wait(timeout=30)
    assert "Plan vs measured" in text.stdout and f"PID {job.pid}" in text.stdout
    rows = {r["component"]: r for r in json.loads(doc.stdout)["rows"]}
    for comp in (Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES):
        row = rows[comp.label]
        assert row["planned"] == row["measured"] and row["error"] == "exact", row
    act = rows[Component.ACTIVATIONS.label]
    assert act["planned"] == pytest.approx(act["measured"], rel=0.01)
    peak = rows["Peak (tensors)"]
    assert peak["planned"] == pytest.approx(peak["measured"], rel=0.05)
