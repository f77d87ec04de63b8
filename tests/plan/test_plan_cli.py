"""`anatomy-top plan` end to end: arguments, config loading, text and JSON output, clear failures."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from anatomy import plan_cli
from anatomy.vocabulary import Component


@pytest.fixture
def bert_dir(tmp_path: Path, tiny_configs: dict[str, Any]) -> Path:
    cfg = tiny_configs["bert"]
    cfg.architectures = ["BertForSequenceClassification"]
    cfg.save_pretrained(tmp_path / "tiny-bert")
    return tmp_path / "tiny-bert"


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = plan_cli.main(argv, out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


def test_json_output_uses_the_vocabulary(bert_dir: Path) -> None:
    rc, out, err = _run(
        [str(bert_dir), "--batch-size", "2", "--seq-len", "32", "--gpu", "A100-40GB", "--json"]
    )
    assert rc == 0, err
    data = json.loads(out)
    assert data["model_class"] == "BertForSequenceClassification"
    assert data["task"] == "sequence-classification"  # from config.architectures
    assert set(data["components"]) <= {c.value for c in Component}
    weights = data["components"]["weights"]
    assert weights["label"] == Component.WEIGHTS.label
    assert weights["guide_bytes_per_param"] == 4.0
    assert data["components"]["cuda_context"]["source"] == "guide"
    assert data["gpu"] == {"name": "A100-40GB", "bytes": 40960 << 20, "source": "--gpu"}
    assert data["fits"] is True and data["spare_bytes"] == data["gpu"]["bytes"] - data["total_bytes"]
    labels = [row["label"] for row in data["techniques"]]
    assert labels[0] == "baseline" and labels[-1].startswith("best combination")
    assert data["largest_batch"]["batch_size"] >= 2


def test_text_output_and_config_json_path(bert_dir: Path) -> None:
    rc, out, err = _run(
        [
            str(bert_dir / "config.json"),
            "--batch-size",
            "2",
            "--seq-len",
            "32",
            "--precision",
            "bf16",
            "--quick",
        ]
    )
    assert rc == 0, err
    for comp in (Component.WEIGHTS, Component.OPTIMIZER_STATES, Component.GRADIENTS, Component.ACTIVATIONS):
        assert comp.label in out
    assert "Predicted peak" in out and "bf16 mixed" in out
    assert "Techniques" not in out  # --quick


def test_cpu_target_has_no_cuda_components(bert_dir: Path) -> None:
    rc, out, _ = _run([str(bert_dir), "--batch-size", "2", "--seq-len", "32", "--target", "cpu", "--json"])
    assert rc == 0
    data = json.loads(out)
    assert data["components"]["cuda_context"]["bytes"] is None
    assert data["fits"] is None and "techniques" not in data


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    rc, out, err = _run([str(tmp_path / "nope" / "config.json")])
    assert rc == 2 and out == ""
    assert "no such file" in err and "Traceback" not in err


def test_directory_without_config(tmp_path: Path) -> None:
    rc, _, err = _run([str(tmp_path)])
    assert rc == 2 and "no config.json" in err


def test_unreachable_hub_id_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rc, _, err = _run(["some-org/some-model-that-is-not-here"])
    assert rc == 2
    assert "hub" in err and "config.json" in err and "Traceback" not in err


def test_bad_arguments_exit_with_usage(bert_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_cli.main([str(bert_dir), "--batch-size", "0"]) == 2
    assert "must be at least 1" in capsys.readouterr().err
    assert plan_cli.main([str(bert_dir), "--optimizer", "lion"]) == 2


def test_too_long_sequence_is_reported(bert_dir: Path) -> None:
    rc, _, err = _run([str(bert_dir), "--seq-len", "100000", "--quick"])
    assert rc == 2 and "position embeddings" in err


def test_trainer_loop_drops_outputs_and_uses_fused_adamw(bert_dir: Path) -> None:
    common = [str(bert_dir), "--batch-size", "2", "--seq-len", "32", "--quick", "--json"]
    rc, plain_out, _ = _run(common)
    rc2, trainer_out, _ = _run([*common, "--loop", "trainer"])
    assert rc == rc2 == 0
    plain, trainer = json.loads(plain_out), json.loads(trainer_out)
    assert plain["settings"]["keep_outputs"] is True and trainer["settings"]["keep_outputs"] is False
    # The foreach AdamW of the plain loop holds sqrt(exp_avg_sq) for every parameter (4 B/param fp32).
    opt_plain, opt_trainer = plain["phase_peaks"]["optimizer"], trainer["phase_peaks"]["optimizer"]
    assert opt_plain - opt_trainer >= plain["components"]["gradients"]["bytes"]
