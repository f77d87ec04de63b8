"""The exporter's series for parameter-efficient and multi-model jobs: the trainable parameter count beside
the total, and the other-models component in the memory series, as published."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tui.exporter.collector import NodeCollector


def test_trainable_parameters_and_other_models_are_exported(
    runtime: Path,
    publishers: Callable[..., Any],
    no_nvml: None,
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
    one: Callable[..., float],
    pick: Callable[..., Any],
) -> None:
    pid = os.getpid()
    hello = make_hello(
        pid,
        rank=0,
        run_id="lora",
        trainable_parameter_count=8_192,
        weight_quantization="nf4",
        other_models={"teacher": 777},
    )
    snap = make_snapshot(pid)
    snap.memory["other_models"] = 777
    publishers(runtime, hello, snap)
    series = scrape(NodeCollector(dirs=[runtime], first_wait_s=0.0), wait_s=0.5)
    assert one(series, "anatomy_model_parameters", run_id="lora") == hello.parameter_count
    assert one(series, "anatomy_model_trainable_parameters", run_id="lora") == 8_192
    assert one(series, "anatomy_memory_bytes", run_id="lora", component="other_models") == 777
    assert one(series, "anatomy_weight_quantization_info", run_id="lora", quantization="nf4") == 1


def test_an_older_hook_has_no_trainable_series(
    runtime: Path,
    publishers: Callable[..., Any],
    no_nvml: None,
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    pick: Callable[..., Any],
) -> None:
    publishers(runtime, make_hello(os.getpid(), rank=0, run_id="old"))
    series = scrape(NodeCollector(dirs=[runtime], first_wait_s=0.0), wait_s=0.5)
    assert pick(series, "anatomy_model_trainable_parameters") == {}
    assert pick(series, "anatomy_weight_quantization_info") == {}
