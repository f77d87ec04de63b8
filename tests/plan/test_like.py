"""`anatomy-top plan --like PID`: the hello's optional fields for it (the model's config, the first batch's
shape and its labels', a PEFT model's LoRA adapter: bounded and validated like every field), what the hook
puts in them, the settings read from a hello (per task: tokens, images, speech, encoder-decoder targets;
LoRA and a quantized base), and plan vs measured on live CPU training processes with the hook
(tui.demo_train, tests/plan/live_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from anatomy import protocol
from anatomy.plan.like import Measured, settings_like
from anatomy.plan.like_settings import like_notes
from anatomy.plan.settings import PlanError, PlanSettings, Target, Task
from anatomy.protocol import MAX_CONFIG_CHARS, MAX_LORA_TARGETS, Hello, LoraAdapter, ProtocolError, Snapshot
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


LORA = LoraAdapter(
    rank=8, target_modules=("q_proj", "v_proj"), dropout=0.1, base_model_class="LlamaForCausalLM"
)


def test_config_and_batch_shape_round_trip() -> None:
    got = _decoded(_hello(model_config=LLAMA, batch_shape=(4, 64), target_shape=(4, 32), lora=LORA))
    assert got.model_config == LLAMA and got.batch_shape == (4, 64)
    assert got.target_shape == (4, 32) and got.lora == LORA
    old = _decoded(_hello())  # an older hook's hello: all absent
    assert old.model_config is None and old.batch_shape is None
    assert old.target_shape is None and old.lora is None


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
        ("target_shape", [4, -32], "whole numbers"),
        ("target_shape", [1] * 9, "more than 8 dimensions"),
        ("lora", {"rank": 0, "target_modules": ["q"]}, "rank 0 is outside"),
        ("lora", {"rank": 1 << 17, "target_modules": ["q"]}, "is outside"),
        ("lora", {"rank": True, "target_modules": ["q"]}, "got bool"),
        ("lora", {"rank": 8}, "missing field 'target_modules'"),
        ("lora", {"rank": 8, "target_modules": []}, "target modules"),
        ("lora", {"rank": 8, "target_modules": ["q"] * (MAX_LORA_TARGETS + 1)}, "target modules"),
        ("lora", {"rank": 8, "target_modules": ["x" * 200]}, "not a short name"),
        ("lora", {"rank": 8, "target_modules": [""]}, "not a short name"),
        ("lora", {"rank": 8, "target_modules": [3]}, "not a short name"),
        ("lora", {"rank": 8, "target_modules": ["q"], "dropout": 1.0}, "not below 1"),
        ("lora", {"rank": 8, "target_modules": ["q"], "dropout": -0.1}, "outside"),
        ("lora", {"rank": 8, "target_modules": ["q"], "base_model_class": "x" * 200}, "not a short name"),
        ("lora", [8], "expected"),
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


WHISPER = json.dumps({"model_type": "whisper", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2})
T5 = json.dumps({"model_type": "t5", "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4})


def test_settings_of_a_speech_job() -> None:
    """Whisper's first input is its log-mel features (batch, mel bins, frames), 100 frames a second: 30 s
    of audio, not a sequence length; the target length is its labels'."""
    from anatomy.plan import Planner

    hello = _hello(
        model_class="WhisperForConditionalGeneration",
        model_config=WHISPER,
        batch_shape=(4, 80, 3000),
        target_shape=(4, 48),
    )
    config, s = settings_like(Measured(hello, _snap()), PlanSettings())
    assert (s.task, s.seq_len, s.audio_seconds, s.target_len) == (Task.SPEECH_SEQ2SEQ, None, 30.0, 48)
    workload, warnings = Planner(config, s.task).workload(s)
    assert (workload.audio_frames, workload.mel_bins, workload.target_len) == (3000, 80, 48)
    assert not warnings  # the model's own 30 s window
    # A hook that saw no labels: the planner's default target length, and a note that says so.
    unlabelled = replace(hello, target_shape=None)
    _, s = settings_like(Measured(unlabelled, _snap()), PlanSettings())
    assert s.target_len is None
    assert any("target length unknown" in n for n in like_notes(unlabelled, s, 0, 0))


def test_settings_of_an_encoder_decoder_job() -> None:
    hello = _hello(model_class="T5ForConditionalGeneration", model_config=T5, batch_shape=(4, 64))
    _, s = settings_like(Measured(replace(hello, target_shape=(4, 16)), _snap()), PlanSettings())
    assert (s.task, s.seq_len, s.target_len) == (Task.SEQ2SEQ_LM, 64, 16)
    # No labels seen: the command line's --target-len, else the source length (the planner's default).
    _, s = settings_like(Measured(hello, _snap()), PlanSettings(target_len=20))
    assert (s.seq_len, s.target_len) == (64, 20)
    _, s = settings_like(Measured(hello, _snap()), PlanSettings())
    assert s.target_len is None
    # A causal LM's labels are not a target length.
    _, s = settings_like(
        Measured(_hello(model_config=LLAMA, batch_shape=(4, 64), target_shape=(4, 64)), _snap()),
        PlanSettings(),
    )
    assert (s.task, s.seq_len, s.target_len) == (Task.CAUSAL_LM, 64, None)


def test_settings_of_a_lora_and_qlora_job() -> None:
    """A PEFT model: LoRA as its adapter says, the base its hello's weight format, planned as the
    transformers class PEFT wraps."""
    hello = _hello(model_class="PeftModelForCausalLM", model_config=LLAMA, batch_shape=(4, 64), lora=LORA)
    config, s = settings_like(Measured(hello, _snap()), PlanSettings())
    assert config.architectures == ["LlamaForCausalLM"]
    assert (s.lora_rank, s.lora_targets, s.lora_dropout, s.quant) == (8, ("q_proj", "v_proj"), 0.1, None)
    _, s = settings_like(Measured(replace(hello, weight_quantization="nf4"), _snap()), PlanSettings())
    assert (s.lora_rank, s.quant) == (8, "nf4")
    _, s = settings_like(
        Measured(replace(hello, lora=None, weight_quantization="fp4"), _snap()), PlanSettings()
    )
    assert (s.lora_rank, s.quant) == (None, "fp4")  # a quantized base alone
    # A hook too old to publish the adapter: the command line's --lora stands.
    _, s = settings_like(Measured(replace(hello, lora=None), _snap()), PlanSettings(lora_rank=16))
    assert s.lora_rank == 16
    # A job that trains more than the plan (PEFT's modules_to_save, ...) is said to.
    notes = like_notes(replace(hello, trainable_parameter_count=5000), s, 4000, 0)
    assert any("trains 5,000 parameters, the plan 4,000" in n for n in notes)
    assert not any("plain loop" in n for n in notes)
    # A plain loop's held outputs, which the hook charges to unattributed memory, are named with their size.
    assert any("previous step's outputs (1000.0 KiB" in n for n in like_notes(hello, s, 0, 1_024_000))


def test_the_hook_publishes_the_lora_adapter() -> None:
    """What PEFT's LoraConfig says, read by the hook without importing peft: "all-linear" as PEFT resolves
    it (one name per kind of layer), a regular expression by the modules it adapted."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    import anatomy

    cfg = json.loads(LLAMA)
    del cfg["model_type"]
    base = LlamaForCausalLM(LlamaConfig(**cfg))
    with anatomy.track(base, torch.optim.AdamW(base.parameters()), publish=False) as tracker:
        assert tracker.hello.lora is None
    linear = ("down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj")
    for targets, expected in (("all-linear", linear), (r".*\.(q_proj|k_proj)", ("k_proj", "q_proj"))):
        model = get_peft_model(
            LlamaForCausalLM(LlamaConfig(**cfg)), LoraConfig(r=4, target_modules=targets, lora_dropout=0.05)
        )
        params = [p for p in model.parameters() if p.requires_grad]
        with anatomy.track(model, torch.optim.AdamW(params), publish=False) as tracker:
            assert tracker.hello.lora == LoraAdapter(4, expected, 0.05, "LlamaForCausalLM")
            assert tracker.hello.model_class == "PeftModel"


def test_a_model_with_a_strange_peft_config_publishes_none() -> None:
    import torch

    from anatomy.hook.adapters import lora_adapter

    class Odd(torch.nn.Linear):
        @property
        def peft_config(self) -> dict[str, Any]:
            return {"default": object()}

    class Failing(torch.nn.Linear):
        @property
        def peft_config(self) -> dict[str, Any]:
            raise RuntimeError("no")

    assert lora_adapter(Odd(2, 2)) is None and lora_adapter(Failing(2, 2)) is None


def test_the_hook_records_the_first_batch_and_its_labels() -> None:
    """A speech model fed by keyword, as a Trainer feeds it: its features are the batch (batch, mel bins,
    frames) and its labels the target; later batches of other shapes change neither."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    import anatomy

    config = WhisperConfig(
        vocab_size=100,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_source_positions=16,
        max_target_positions=16,
        decoder_start_token_id=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    model = WhisperForConditionalGeneration(config)
    opt = torch.optim.AdamW(model.parameters())
    with anatomy.track(model, opt, publish=False, sample_every=0) as tracker:
        for target in (8, 12):
            with tracker.step():
                out = model(input_features=torch.randn(2, 8, 32), labels=torch.randint(3, 100, (2, target)))
                out.loss.backward()
                opt.step()
                opt.zero_grad()
        assert (tracker.hello.batch_shape, tracker.hello.target_shape) == ((2, 8, 32), (2, 8))


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


LIVE_JOBS = {
    # case: (the job's arguments, what the plan's label or notes must say it read from the hello)
    "llama-lora-dropout": (
        ["--family", "llama", "--lora", "8", "--lora-dropout", "0.1"],
        "rank 8 on q_proj, v_proj, dropout 0.1",
    ),
    "llama-qlora": (
        ["--family", "llama", "--lora", "8", "--quant", "nf4"],
        "quantized by bitsandbytes (nf4)",
    ),
    "t5-lora": (["--family", "t5", "--lora", "8"], "source 64 / target 32 tokens"),
    "whisper": (["--family", "whisper"], "1.28 s audio / target 32 tokens"),
}


@dataclass
class LiveJob:
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str]

    def wait_lingering(self) -> None:
        deadline = time.monotonic() + 300
        while "lingering" not in self.log.read_text(errors="replace"):
            alive = self.process.poll() is None
            assert alive and time.monotonic() < deadline, self.log.read_text(errors="replace")
            time.sleep(0.2)


@pytest.fixture(scope="module")
def live_jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LiveJob]]:
    """Every live job started at once (their start-up, mostly imports, overlaps); each lingers, idle,
    publishing its last step until the module's tests are done."""
    root = tmp_path_factory.mktemp("live")
    runtime = root / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, ANATOMY_TOP_DIR=str(runtime), PYTHONPATH=str(REPO))
    env.pop("ANATOMY_TOP", None)
    jobs: dict[str, LiveJob] = {}
    try:
        for case, (args, _) in LIVE_JOBS.items():
            log = root / f"{case}.log"
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    [sys.executable, str(REPO / "tests" / "plan" / "live_job.py"), *args, "--drop-outputs"],
                    cwd=REPO,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            jobs[case] = LiveJob(process, log, env)
        yield jobs
    finally:
        for job in jobs.values():
            job.process.terminate()
        for job in jobs.values():
            try:
                job.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                job.process.kill()
                job.process.wait(timeout=30)


def _at_peak(job: LiveJob) -> str:
    from anatomy.plan.like import read_process

    try:
        snap = read_process(job.process.pid, Path(job.env["ANATOMY_TOP_DIR"])).snapshot
        split = {c.name: v for c, v in (snap.at_peak or {}).items()}
        where = f"step {snap.step}: peak {snap.peak_bytes} in {snap.peak_phase}"
        return f"{where}, at peak (traced on step {snap.at_peak_step}) {split}"
    except Exception as exc:  # (a diagnostic only)
        return f"not read: {exc!r}"


@pytest.mark.slow
@pytest.mark.parametrize("case", list(LIVE_JOBS))
def test_like_live_lora_qlora_and_speech_jobs(case: str, live_jobs: dict[str, LiveJob]) -> None:
    """Real training processes built as users build them (PEFT LoRA, a bitsandbytes 4-bit base, T5 and
    Whisper fed by keyword), publishing through the hook; `--like` plans each from its hello alone.

    The jobs keep only the loss of the outputs, as the Trainer does (``--loop trainer``). In a plain loop
    the previous step's outputs (here a megabyte of logits) are still held when a step starts, and the
    hook charges them to unattributed memory for the whole step though the forward frees them: its
    tensor peak then reads low by their size (about -10% on these models); the plan says so."""
    job = live_jobs[case]
    job.wait_lingering()
    cmd = [sys.executable, "-m", "anatomy.plan_cli", "--like", str(job.process.pid), "--json"]
    cmd += ["--loop", "trainer", "--optimizer-impl", "for-loop"]
    done = subprocess.run(cmd, cwd=REPO, env=job.env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    rows = {r["component"]: r for r in doc["rows"]}
    for comp in (Component.WEIGHTS, Component.GRADIENTS, Component.OPTIMIZER_STATES):
        row = rows[comp.label]
        assert row["planned"] == row["measured"] and row["error"] == "exact", row
    act = rows[Component.ACTIVATIONS.label]
    assert act["planned"] == pytest.approx(act["measured"], rel=0.01)
    peak = rows["Peak (tensors)"]
    # (on a failure, what the snapshot said: the split at its peak, which traced step gave it)
    assert peak["planned"] == pytest.approx(peak["measured"], rel=0.05), (doc, _at_peak(job))
    assert LIVE_JOBS[case][1] in doc["label"] + " ".join(doc["notes"]), doc
    assert not any("the plan does not model" in n for n in doc["notes"])  # trainable counts agree
