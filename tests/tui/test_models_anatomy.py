"""The monitor's side of parameter-efficient, quantized and multi-model training: the parameter line
(``592.5k params (8.2k trainable) · nf4``) in the pane, ``--once`` text and JSON; bytes per parameter of
gradients and optimizer states per trainable parameter; the other-models row with its letter and style."""

from __future__ import annotations

import json

import pytest

from anatomy.protocol import Hello, Snapshot
from anatomy.vocabulary import COMPONENT_HELP, Component, PublisherState
from tui import format as fmt
from tui.report.anatomy_json import process_dict
from tui.report.anatomy_text import render_process
from tui.sources.anatomy_source import TrainingProcess
from tui.sources.reconcile import reconcile
from tui.view.anatomy_text import title_text
from tui.view.bars import COMPONENT_LETTERS, COMPONENT_STYLES, component_mark

TOTAL, TRAINABLE = 592_496, 8_192


def _hello(**kw: object) -> Hello:
    fields: dict[str, object] = dict(
        pid=7,
        host="h",
        device="cpu",
        precision="fp32",
        optimizer="adamw",
        model_class="PeftModelForCausalLM",
        parameter_count=TOTAL,
        torch_version="2.13.0",
        started_at=1.0,
        trainable_parameter_count=TRAINABLE,
        weight_quantization="nf4",
        other_models={"teacher": 3_000_000},
    )
    fields.update(kw)
    return Hello(**fields)  # type: ignore[arg-type]


def _snapshot(trainable: int | None = TRAINABLE) -> Snapshot:
    memory = {
        "runtime": 50_000_000,
        "weights": 4 * TOTAL,
        "other_models": 3_000_000,
        "optimizer_states": 8 * TRAINABLE + 32,
        "gradients": 4 * TRAINABLE,
        "activations": 1_000_000,
        "temporaries": 200_000,
        "unattributed": 10_000,
    }
    at_peak = dict(memory)
    return Snapshot(
        pid=7,
        seq=1,
        time=2.0,
        step=3,
        memory=dict(memory),
        expected_bytes_per_param={"weights": 4.0, "optimizer_states": 8.0, "gradients": 4.0},
        parameter_count=TOTAL,
        trainable_parameter_count=trainable,
        peak_bytes=sum(at_peak.values()),
        peak_phase="backward",
        at_peak=at_peak,
    )


def _proc() -> TrainingProcess:
    return TrainingProcess(pid=7, hello=_hello(), snapshot=_snapshot(), state=PublisherState.LIVE)


def test_the_parameter_line() -> None:
    assert fmt.fmt_params(TOTAL, TRAINABLE, "nf4") == "592.5k params (8.2k trainable) · nf4"
    assert fmt.fmt_params(TOTAL, TOTAL, None) == "592.5k params"  # everything trains: nothing to add
    assert fmt.fmt_params(TOTAL) == "592.5k params"  # an older hook


@pytest.mark.parametrize("source", ["snapshot", "hello"])
def test_gradients_and_optimizer_states_are_per_trainable_parameter(source: str) -> None:
    snap = _snapshot(trainable=TRAINABLE if source == "snapshot" else None)
    rec = reconcile(_hello(), snap, None)
    rows = {r.component: r for r in rec.rows}
    assert rows[Component.OPTIMIZER_STATES].bytes_per_param == pytest.approx((8 * TRAINABLE + 32) / TRAINABLE)
    assert rows[Component.GRADIENTS].bytes_per_param == pytest.approx(4.0)
    assert rows[Component.WEIGHTS].bytes_per_param == pytest.approx(4.0)  # per parameter of the whole model
    assert rec.trainable_parameter_count == TRAINABLE
    assert rows[Component.OTHER_MODELS].bytes == 3_000_000
    assert rec.reconciles  # the other-models row is one of the rows that sum to the peak


def test_an_older_hook_divides_by_the_total() -> None:
    rec = reconcile(_hello(trainable_parameter_count=None), _snapshot(trainable=None), None)
    rows = {r.component: r for r in rec.rows}
    assert rows[Component.OPTIMIZER_STATES].bytes_per_param == pytest.approx((8 * TRAINABLE + 32) / TOTAL)


def test_once_text_and_json_show_it() -> None:
    text = render_process(_proc())
    assert "592.5k params (8.2k trainable) · nf4" in text
    assert "Other models" in text
    doc = process_dict(_proc())
    json.dumps(doc)
    assert doc["hello"]["trainable_parameter_count"] == TRAINABLE
    assert doc["hello"]["weight_quantization"] == "nf4"
    assert doc["hello"]["other_models"] == {"teacher": 3_000_000}
    assert doc["reconciled"]["trainable_parameter_count"] == TRAINABLE
    row = next(r for r in doc["reconciled"]["rows"] if r["component"] == "other_models")
    assert row["label"] == "Other models" and row["bytes"] == 3_000_000


def test_the_pane_title_and_the_row_marks() -> None:
    assert "592.5k params (8.2k trainable) · nf4" in title_text(_proc()).plain
    letters = list(COMPONENT_LETTERS.values())
    assert len(set(letters)) == len(letters) == len(Component)  # one distinct letter per component
    assert component_mark(Component.OTHER_MODELS, plain=True) == ("M", "bold")
    assert Component.OTHER_MODELS in COMPONENT_STYLES and Component.OTHER_MODELS in COMPONENT_HELP
