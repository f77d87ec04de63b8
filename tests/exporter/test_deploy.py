"""What ships beside the exporter (deploy/, docs/cluster.md), checked by the tools that will run it:
promtool for the Prometheus config and rules (rule unit tests included), systemd-analyze for the unit,
the exporter's own argument parser for every command line written down, and a scrape for every metric
name the dashboard, the rules and the docs mention."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tui import simnvml
from tui.exporter.collector import NodeCollector
from tui.exporter.server import DEFAULT_PORT, build_parser

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "anatomy-top.json"
RULES = DEPLOY / "prometheus" / "anatomy-rules.yml"
DOCS = REPO / "docs" / "cluster.md"
METRIC = re.compile(r"\b(anatomy_[a-z0-9_]+|run_id:anatomy_[a-z0-9_:]+)\b")
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location(
        "grafana_dashboard", REPO / "scripts" / "grafana_dashboard.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in board["templating"]["list"] if v.get("type") == "query"]
    return exprs


def test_dashboard_is_what_the_generator_writes() -> None:
    assert DASHBOARD.read_text() == _generator().render(), "run: python scripts/grafana_dashboard.py"


def test_dashboard_is_well_formed() -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in board["templating"]["list"]}
    assert names == {"datasource", "instance", "run_id", "rank"}
    for p in board["panels"]:
        if p["type"] == "row":
            continue
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert p["datasource"]["uid"] == "${datasource}"
        for t in p["targets"]:
            # Every $variable a query uses is defined (Grafana's built-ins start with __).
            for var in re.findall(r"\$(\w+)", t["expr"]):
                assert var in names or var.startswith("__") or var.isdigit(), (p["title"], var)
    titles = " | ".join(p["title"] for p in board["panels"])
    for wanted in ("Memory by component", "Step time per rank", "Op-group share", "GPU memory: NVML"):
        assert wanted in titles
    (memory,) = [p for p in board["panels"] if p["title"].startswith("Memory by component")]
    assert memory["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    assert memory["repeat"] == "rank"  # one stacked panel per rank


@pytest.fixture
def emitted(
    runtime: Path,
    ranks: Callable[..., Any],
    sim: Callable[..., Any],
    scrape: Callable[..., Any],
    make_hello: Callable[..., Any],
    make_snapshot: Callable[..., Any],
) -> set[str]:
    """Every metric name a scrape holds when every field is there (CUDA, op groups, MFU, GPUs)."""
    hello = make_hello(0, rank=0, run_id="r", trainable_parameter_count=8_192, weight_quantization="nf4")
    rank = ranks(runtime, hello, make_snapshot(0))
    box = simnvml.Scenario.demo_box(2, pids=[rank.pid])
    # A board with a fan (SXM boards have none: N/A, no sample) so that every GPU family appears.
    box.gpus[1] = dataclasses.replace(box.gpus[1], fan_percent=simnvml.Curve.constant(40), num_fans=1)
    sim(box)
    series = scrape(NodeCollector(dirs=[runtime]))
    return {name for name, _ in series}


def test_every_metric_the_dashboard_rules_and_docs_name_is_emitted(emitted: set[str]) -> None:
    assert "anatomy_memory_bytes" in emitted and "anatomy_steps_total" in emitted
    recorded = set(re.findall(r"record: (\S+)", RULES.read_text()))
    sources = {
        "dashboard": " ".join(dashboard_exprs()),
        "rules": RULES.read_text(),
        "rule tests": (DEPLOY / "prometheus" / "anatomy-rules.test.yml").read_text(),
        "docs/cluster.md": DOCS.read_text(),
    }
    for where, text in sources.items():
        named = set(METRIC.findall(text))
        assert named, where
        unknown = sorted(named - emitted - recorded)
        assert not unknown, f"{where} names metrics the exporter does not emit: {unknown}"


@needs_promtool
def test_prometheus_config_and_rules_pass_promtool() -> None:
    cwd = DEPLOY / "prometheus"
    for args in (
        ["check", "config", "prometheus.yml"],
        ["check", "rules", "anatomy-rules.yml"],
        ["test", "rules", "anatomy-rules.test.yml"],  # the alerts fire when, and only when, they should
    ):
        out = subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}{out.stderr}"


def _parses(args: list[str]) -> Any:
    return build_parser().parse_args(args)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = (DEPLOY / "systemd" / "anatomy-top-exporter.service").read_text()
    (exec_start,) = re.findall(r"^ExecStart=(.+)$", unit, re.M)
    binary, *rest = shlex.split(exec_start)
    assert rest[0] == "exporter"
    (default_args,) = re.findall(r'^Environment="ANATOMY_TOP_EXPORTER_ARGS=(.+)"$', unit, re.M)
    args = _parses(shlex.split(default_args))
    assert args.listen.port == DEFAULT_PORT
    # systemd-analyze checks that ExecStart's program exists: point it at this checkout's.
    here = Path(sys.executable).with_name("anatomy-top")
    (tmp_path / "anatomy-top-exporter.service").write_text(unit.replace(binary, str(here)))
    out = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "anatomy-top-exporter.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and "anatomy-top-exporter.service" not in out.stderr, out.stderr


def test_kubernetes_daemonset_is_consistent() -> None:
    yaml = pytest.importorskip("yaml")
    (ds,) = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "anatomy-top-exporter.yaml").read_text()))
    assert ds["kind"] == "DaemonSet" and ds["apiVersion"] == "apps/v1"
    pod = ds["spec"]["template"]
    assert pod["metadata"]["labels"] == ds["spec"]["selector"]["matchLabels"]
    spec = pod["spec"]
    assert spec["hostPID"] is True
    (container,) = spec["containers"]
    assert container["args"][0] == "exporter"
    args = _parses([a.replace("$(NODE_NAME)", "node-1") for a in container["args"][1:]])
    (port,) = container["ports"]
    assert (
        args.listen.port == port["containerPort"] == int(pod["metadata"]["annotations"]["prometheus.io/port"])
    )
    (mount,) = container["volumeMounts"]
    assert [str(Path(d)) for d in args.dir] == [mount["mountPath"]]
    (volume,) = spec["volumes"]
    assert volume["name"] == mount["name"] and volume["hostPath"]["path"] == mount["mountPath"]
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    (pm,) = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "podmonitor.yaml").read_text()))
    assert pm["spec"]["selector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == port["name"]


def test_containerfile_command_parses() -> None:
    text = (DEPLOY / "kubernetes" / "Containerfile").read_text()
    (cmd,) = re.findall(r"^CMD (\[.+\])$", text, re.M)
    args = json.loads(cmd)
    assert args[0] == "exporter"
    assert _parses(args[1:]).listen.port == DEFAULT_PORT


def test_docs_command_lines_parse() -> None:
    """Every `anatomy-top exporter ...` line in docs/cluster.md is one the exporter accepts."""
    lines = re.findall(r"anatomy-top exporter((?: --?[\w-]+(?:[ =][^\s`|\\]+)?)*)", DOCS.read_text())
    assert len(lines) >= 3
    for line in lines:
        _parses(shlex.split(line.replace("$(NODE_NAME)", "n")))


@needs_promtool
def test_documented_dcgm_joins_evaluate_as_documented() -> None:
    """The joins with dcgm-exporter in docs/cluster.md, run by Prometheus' engine (promtool test rules)
    on series labelled as each exporter labels them."""
    yaml = pytest.importorskip("yaml")
    joins = REPO / "tests" / "exporter" / "data" / "dcgm_joins.test.yml"
    out = subprocess.run(
        ["promtool", "test", "rules", str(joins)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    docs = DOCS.read_text()
    exprs = [
        t["expr"] for case in yaml.safe_load(joins.read_text())["tests"] for t in case["promql_expr_test"]
    ]
    assert len(exprs) == 3
    for expr in exprs:
        assert expr in docs, f"docs/cluster.md lacks the tested join: {expr}"
