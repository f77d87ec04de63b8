"""LoRA / QLoRA / speech from the command line: bad input is one line and exit 2 (before torch
loads where no model is needed, before the fake step where one is), --help lists the tasks, and the
technique table's LoRA, QLoRA and paged 8-bit AdamW rows and the largest batch work with them."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from anatomy import plan_cli, techniques
from anatomy.plan import Planner, PlanSettings, largest_batch, technique_table
from anatomy.vocabulary import Component


@pytest.fixture
def llama_dir(tmp_path: Path, tiny_configs: dict[str, Any]) -> Path:
    cfg = tiny_configs["llama"]
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(tmp_path / "llama")
    return tmp_path / "llama"


def _run_bad(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    import anatomy.plan.planner as planner_module

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the fake step ran before the input was checked")

    monkeypatch.setattr(planner_module, "run_step_profile", refuse)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):  # argparse writes its own errors to sys.stderr
        rc = plan_cli.main(argv, out=out, err=err)
    text = err.getvalue()
    assert rc == 2 and out.getvalue() == "", text
    assert text.count("\n") == 1 and text.startswith("anatomy-top plan: ") and "Traceback" not in text
    return text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--lora", "0"], "--lora: 0 must be at least 1"),
        (["--lora", "-3"], "--lora: -3 must be at least 1"),
        (["--lora-dropout", "0.1"], "need --lora R"),
        (["--lora", "8", "--lora-dropout", "1.5"], "must be in [0, 1)"),
        (["--quant", "int4"], "invalid choice: 'int4'"),
        (["--audio-seconds", "30"], "--audio-seconds applies to speech-seq2seq"),
    ],
)
def test_bad_adapter_settings_before_torch(
    extra: list[str], message: str, llama_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert message in _run_bad([str(llama_dir), *extra], monkeypatch)


def test_lora_zero_is_refused_before_torch_is_imported(llama_dir: Path) -> None:
    code = (
        "import sys; from anatomy import plan_cli; rc = plan_cli.main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch was imported'; raise SystemExit(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(llama_dir), "--lora", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "--lora: 0 must be at least 1" in done.stderr


def test_unknown_lora_target_before_the_fake_step(llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = _run_bad([str(llama_dir), "--lora", "8", "--lora-targets", "q_proj,qkv_proj"], monkeypatch)
    assert "qkv_proj is not a module of LlamaForCausalLM" in text and "q_proj" in text


def test_help_lists_the_tasks_and_adapter_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "speech-seq2seq" in text and "--audio-seconds" in text
    for option in ("--lora", "--lora-targets", "--lora-dropout", "--qlora", "--quant", "paged-adamw-8bit"):
        assert option in text


def test_qlora_on_cpu_is_planned(llama_dir: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    rc = plan_cli.main(
        [str(llama_dir), "--qlora", "--target", "cpu", "--seq-len", "32", "--json"], out=out, err=err
    )
    assert rc == 0, err.getvalue()
    data = json.loads(out.getvalue())
    assert data["settings"]["lora_rank"] == 8 and data["settings"]["quant"] == "nf4"
    assert data["model_class"] == "LlamaForCausalLM + LoRA"
    assert any("double quantization" in n for n in data["notes"])


def test_technique_table_has_lora_qlora_and_paged_rows(tiny_configs: dict[str, Any]) -> None:
    planner = Planner(tiny_configs["llama"], "causal-lm")
    settings = PlanSettings(batch_size=2, seq_len=32)
    rows = technique_table(planner, settings, gpu_bytes=1 << 34)
    by_key = {row.keys: row for row in rows if len(row.keys) == 1}
    lora = by_key[(techniques.LORA,)]
    qlora = by_key[(techniques.QLORA,)]
    paged = by_key[(techniques.PAGED_ADAMW_8BIT,)]
    eight = by_key[(techniques.ADAMW_8BIT,)]
    base = rows[0].result
    assert base is not None and lora.result is not None and qlora.result is not None
    # LoRA: adapters' gradients and states only; QLoRA also shrinks the frozen weights.
    for comp in (Component.GRADIENTS, Component.OPTIMIZER_STATES):
        assert lora.result.components[comp] < base.components[comp] / 10
    assert qlora.result.components[Component.WEIGHTS] < lora.result.components[Component.WEIGHTS]
    # Paged 8-bit AdamW holds what 8-bit AdamW holds.
    assert paged.result is not None and eight.result is not None
    assert paged.result.components == eight.result.components
    assert lora.speed_source == qlora.speed_source == "no guide figure"


def test_largest_batch_with_qlora(tiny_configs: dict[str, Any]) -> None:
    planner = Planner(tiny_configs["llama"], "causal-lm")
    settings = PlanSettings(batch_size=1, seq_len=32, lora_rank=8, quant="nf4")
    gpu = planner.plan(replace(settings, batch_size=8), gpu_bytes=1 << 40).total_bytes + 1000
    search = largest_batch(planner, settings, gpu_bytes=gpu)
    assert search.batch_size is not None and search.batch_size >= 8
    assert planner.plan(replace(settings, batch_size=search.batch_size), gpu_bytes=gpu).fits
    assert not planner.plan(replace(settings, batch_size=search.batch_size + 1), gpu_bytes=gpu).fits
