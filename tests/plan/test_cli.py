"""`anatomy-top plan` end to end: arguments, config loading, text and JSON output, clear failures."""

from __future__ import annotations

import contextlib
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


# ---------------------------------------------------------------------------------------------
# Every input checked before the fake step; other families; the help


def _refuse_fake_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    import anatomy.plan.planner as planner_module

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the fake step ran before the input was checked")

    monkeypatch.setattr(planner_module, "run_step_profile", refuse)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gpu", "0GiB"], "a GPU has at least 1 MiB"),
        (["--gpu", "Z80"], "unknown GPU 'Z80'"),
        (["--gpu", "Z80", "--target", "cpu"], "unknown GPU 'Z80'"),
        (["--gpu", "H100", "--target", "cpu"], "--gpu does not apply to --target cpu"),
        (["--batch-size", "1e12"], "batch size 1,000,000,000,000 is more than a plan can model"),
        (["--batch-size", "1e20"], "is more than a plan can model"),
        (["--batch-size", "2.5"], "'2.5' is not a whole number"),
        (["--seq-len", "100000"], "exceeds the model's 128 position embeddings"),
        (["--target-len", "16"], "--target-len applies to seq2seq-lm"),
        (["--image-size", "224"], "--image-size applies to image-classification"),
        (["--task", "image-classification"], "no image-classification head"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    extra: list[str], message: str, bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_fake_steps(monkeypatch)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):  # argparse writes its own errors to sys.stderr
        rc = plan_cli.main([str(bert_dir), *extra], out=out, err=err)
    text = err.getvalue()
    assert rc == 2 and out.getvalue() == ""
    assert message in text and text.count("\n") == 1, text
    assert text.startswith("anatomy-top plan: ") and "Traceback" not in text


def test_rope_beyond_its_positions_warns_and_plans(tmp_path: Path, tiny_configs: dict[str, Any]) -> None:
    cfg = tiny_configs["llama"]
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(tmp_path / "llama")
    rc, out, err = _run(
        [str(tmp_path / "llama"), "--seq-len", "256", "--batch-size", "1", "--quick", "--json"]
    )
    assert rc == 0
    assert "warning: sequence length 256 is beyond the model's max_position_embeddings (128)" in _flat(err)
    assert json.loads(out)["warnings"]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_help_lists_every_task(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    for task in ("causal-lm", "masked-lm", "sequence-classification", "seq2seq-lm", "image-classification"):
        assert task in text
    assert "--target-len" in text and "--image-size" in text and "--no-kv-cache" in text
    assert "--no-padding" in text


@pytest.mark.parametrize(
    ("name", "make", "args", "task"),
    [
        (
            "t5",
            lambda: __import__("transformers").T5Config(
                vocab_size=500,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=2,
                num_heads=4,
                architectures=["T5ForConditionalGeneration"],
            ),
            ["--seq-len", "64", "--target-len", "16", "--quick"],
            "seq2seq-lm",
        ),
        (
            "vit",
            lambda: __import__("transformers").ViTConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=2,
                intermediate_size=64,
                image_size=32,
                patch_size=8,
                architectures=["ViTForImageClassification"],
            ),
            ["--image-size", "48"],
            "image-classification",
        ),
    ],
)
def test_other_families_end_to_end(name: str, make: Any, args: list[str], task: str, tmp_path: Path) -> None:
    make().save_pretrained(tmp_path / name)
    rc, out, err = _run([str(tmp_path / name), "--batch-size", "2", "--gpu", "A100-40GB", *args])
    assert rc == 0, err
    assert f", {task})" in out and "Predicted peak" in out
    assert ("Largest batch that fits" in out) == ("--quick" not in args)
    assert all(len(line) <= 80 for line in out.splitlines())
    rc, out, _ = _run([str(tmp_path / name), "--batch-size", "2", "--quick", "--json", *args])
    assert rc == 0
    data = json.loads(out)
    assert data["task"] == task and data["workload"]["task"] == task
