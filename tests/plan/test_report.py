"""The plan as text (anatomy.plan.report): an 80-column pane, words never split, every speed
factor's source on its row, the best combination never cut."""

from __future__ import annotations

import io
import re
from dataclasses import replace
from typing import Any

import pytest

from anatomy import techniques
from anatomy.plan import Planner, PlanSettings, largest_batch, technique_table
from anatomy.plan.report import WIDTH, render_text
from anatomy.plan.search import BEST_PREFIX, TechniqueRow


def _flat(text: str) -> str:
    """The text with its line breaks and indents undone (a word split by a wrap would show)."""
    return re.sub(r"\s+", " ", text)


@pytest.fixture(scope="module")
def rendered(tiny_configs: dict[str, Any]) -> tuple[str, Any, list[TechniqueRow]]:
    planner = Planner(
        tiny_configs["llama"], "causal-lm", name="/models/a-model-with-a-rather-long-path/llama"
    )
    settings = PlanSettings(batch_size=8, seq_len=64)
    base = planner.plan(settings, gpu_bytes=1 << 40)
    gpu = base.total_bytes - 1  # just too small: the table has something to say
    rows = technique_table(planner, settings, gpu_bytes=gpu)
    keys = (
        techniques.GRAD_ACCUM,
        techniques.CHECKPOINTING,
        techniques.MIXED_PRECISION,
        techniques.ADAMW_8BIT,
    )
    long_best = TechniqueRow(
        BEST_PREFIX + " + ".join(techniques.TECHNIQUES[k].label for k in keys),
        keys,
        replace(settings, precision=rows[0].settings.precision),
        rows[0].result,
        techniques.combined_speed_factor(keys),
        "product of guide factors (estimate)",
    )
    rows = [*[r for r in rows if not r.is_best], long_best]
    batch = largest_batch(planner, settings, gpu_bytes=gpu)
    result = planner.plan(settings, gpu_bytes=gpu)
    out = io.StringIO()
    render_text(result, rows, batch, out)
    return out.getvalue(), result, rows


def test_every_line_fits_80_columns(rendered: tuple[str, Any, list[TechniqueRow]]) -> None:
    text, _, _ = rendered
    too_long = [line for line in text.splitlines() if len(line) > WIDTH]
    assert too_long == []


def test_no_word_is_split(rendered: tuple[str, Any, list[TechniqueRow]]) -> None:
    text, result, rows = rendered
    flat = _flat(text)
    for note in result.notes:
        assert _flat(f"note: {note}") in flat
    assert result.model in flat
    for row in rows:
        assert _flat(row.label) in flat  # the best combination whole, with every technique it names


def test_every_technique_row_names_its_speed_source(rendered: tuple[str, Any, list[TechniqueRow]]) -> None:
    text, _, rows = rendered
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("technique "))
    table = lines[start + 1 : start + 1 + 2 * len(rows)]
    figures = [line for line in table if re.search(r"(yes|no|-)\s+(x\d\.\d\d|-)\s+\S", line)]
    assert len(figures) == len(rows)
    sources = [line.split()[-1] for line in figures]
    for row, source in zip(rows, sources, strict=True):
        if row.speed_factor is None:
            assert source == "figure"  # "no figure"
        elif not row.keys:
            assert source == "-"
        else:
            assert source in (techniques.GUIDE_SOURCE_SHORT, "product")
    # The legend says what the short source means, in words.
    assert "BERT-large" in _flat(text) and "V100" in _flat(text) and "not for this model" in _flat(text)
