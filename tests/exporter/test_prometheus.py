"""A real Prometheus (Debian's ``prometheus``) scrapes ``anatomy-top exporter`` every second while a real
CPU training job publishes through the real hook: what Prometheus stored, read back through its HTTP API,
equals what the hook published, and when the job ends its series go stale in Prometheus too."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from anatomy import protocol
from anatomy.protocol import Hello, Snapshot

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "anatomy-rules.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "anatomy-top.json"
# Dashboard queries with nothing to show for this job: a CPU job has no MFU, and no GPU is lost.
EMPTY_HERE = {"MFU per rank": "no MFU on CPU", "Uncorrected ECC errors, GPUs lost/B": "no GPU lost"}
SMALL = ["--batch", "4", "--seq", "32", "--sample-every", "2", "--steps", "3", "--linger"]
FIRST_SCRAPE_S = 60.0  # Prometheus' first scrape lands within a few seconds; allow for a loaded box
CONFIG = """\
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: ["{rules}"]
scrape_configs:
  - job_name: anatomy
    static_configs:
      - targets: ["{target}"]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for(text: str, log: Path, proc: subprocess.Popen[Any], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace")
        if text in content:
            return content
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not in {log.name}:\n{log.read_text(errors='replace')[-3000:]}")


class Stack:
    """The training job, the exporter and Prometheus, each its own process; logs under ``base``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.runtime = base / "run"
        self.runtime.mkdir(mode=0o700)
        self.procs: list[subprocess.Popen[Any]] = []
        self.train: subprocess.Popen[Any] | None = None
        self.prom_url = ""
        self.timings: dict[str, float] = {}

    def launch(self, args: list[str], log: str, **env: str) -> subprocess.Popen[Any]:
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("ANATOMY_TOP")}
        full_env.update(ANATOMY_TOP_DIR=str(self.runtime), PYTHONPATH=str(REPO), **env)
        with open(self.base / log, "wb") as out:
            proc = subprocess.Popen(
                args, cwd=REPO, env=full_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        from tui.demo import build_scenario

        self.train = self.launch([sys.executable, "-m", "tui.demo_train", *SMALL], "train.log")
        _wait_for("lingering", self.base / "train.log", self.train, 180)
        scenario = self.base / "scenario.json"
        build_scenario(self.train.pid, [], n_gpus=2).to_json(scenario)
        exporter = self.launch(
            [sys.executable, "-m", "tui.cli", "exporter", "--listen", "127.0.0.1:0", "--hostname", "node-a"],
            "exporter.log",
            ANATOMY_TOP_SIMULATE=str(scenario),
        )
        served = _wait_for("serving http://", self.base / "exporter.log", exporter, 60)
        target = re.search(r"serving http://(\S+)/metrics", served)
        assert target is not None
        prom_port = _free_port()
        config = self.base / "prometheus.yml"
        config.write_text(CONFIG.format(target=target.group(1), rules=RULES))
        started = time.monotonic()
        prom = self.launch(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={self.base / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            "prometheus.log",
        )
        self.prom_url = f"http://127.0.0.1:{prom_port}"
        _wait_for("Server is ready to receive web requests", self.base / "prometheus.log", prom, 60)
        self.timings["prometheus_ready_s"] = time.monotonic() - started

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prom_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait_for_series(self, expr: str, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expr)
            if result:
                return result
            time.sleep(0.5)
        raise AssertionError(f"Prometheus holds no {expr} after {timeout:g} s; logs in {self.base}")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            _stop(proc)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    pytest.importorskip("torch")
    pytest.importorskip("prometheus_client", reason="the 'exporter' extra is not installed")
    if shutil.which("prometheus") is None:
        pytest.skip(
            "Debian's prometheus is not installed "
            "(scripts/test installs it as root: apt-get install prometheus)"
        )
    s = Stack(tmp_path_factory.mktemp("prom"))
    try:
        s.start()
        yield s
    finally:
        s.stop()


def _hook_view(stack: Stack) -> tuple[Hello, Snapshot]:
    assert stack.train is not None
    with protocol.Reader(stack.runtime / protocol.socket_name(stack.train.pid)) as reader:
        reader.wait(timeout=10)
        assert reader.hello is not None and reader.snapshot is not None
        return reader.hello, reader.snapshot


def test_prometheus_stores_the_hooks_bytes(stack: Stack) -> None:
    started = time.monotonic()
    stored = stack.wait_for_series("anatomy_memory_bytes", FIRST_SCRAPE_S)
    stack.timings["first_series_s"] = time.monotonic() - started
    hello, snap = _hook_view(stack)
    published = {k: v for k, v in snap.memory.items() if v is not None}
    assert len(published) >= 4  # weights, optimizer states, gradients, activations at least
    by_component = {r["metric"]["component"]: r for r in stored}
    assert set(by_component) == set(published)
    for component, value in published.items():
        r = by_component[component]
        assert r["metric"]["job"] == "anatomy" and r["metric"]["rank"] == "0"
        assert r["metric"]["run_id"] == f"local-{hello.pid}"
        assert int(float(r["value"][1])) == value, component
    # The join a dashboard makes: memory of a rank with its model and PID from the info series.
    joined = stack.query(
        'anatomy_memory_bytes{component="weights"}'
        " * on(run_id, rank) group_left(pid, model) anatomy_rank_info"
    )
    assert len(joined) == 1
    assert joined[0]["metric"]["pid"] == str(hello.pid)
    assert joined[0]["metric"]["model"] == hello.model_class
    assert int(float(joined[0]["value"][1])) == published["weights"]
    # NVML's figure for the process (simulated GPU 0) beside the anatomy's sum.
    (nvml,) = stack.query("anatomy_rank_gpu_memory_used_bytes")
    from tui.demo import TRAIN_GPU_MEMORY

    assert int(float(nvml["value"][1])) == TRAIN_GPU_MEMORY
    (gpu0,) = stack.query('anatomy_gpu_memory_used_bytes{gpu="0", hostname="node-a"}')
    assert gpu0["metric"]["UUID"].startswith("GPU-")
    (target,) = stack.query('up{job="anatomy"}')
    assert target["value"][1] == "1"


def test_every_dashboard_query_is_answered(stack: Stack) -> None:
    """Each panel's query, with the dashboard's variables at "All", against what Prometheus stored."""
    stack.wait_for_series("anatomy_step_duration_seconds", FIRST_SCRAPE_S)
    stack.wait_for_series("anatomy_op_group_duration_seconds", FIRST_SCRAPE_S)
    board = json.loads(DASHBOARD.read_text())
    answered = []
    for panel in board["panels"]:
        for t in panel.get("targets", []):
            expr = t["expr"].replace("$instance", ".*").replace("$run_id", ".*").replace("$rank", ".*")
            result = stack.query(expr)  # a query Prometheus rejects fails here
            key = panel["title"] if t["refId"] == "A" else f"{panel['title']}/{t['refId']}"
            if key in EMPTY_HERE:
                assert result == [], key
            else:
                assert result, f"no data for panel {key!r}: {expr}"
                answered.append(key)
    assert len(answered) >= 14
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            selector, label = re.fullmatch(r"label_values\((.+), (\w+)\)", var["definition"]).groups()
            result = stack.query(selector.replace("$instance", ".*").replace("$run_id", ".*"))
            assert result and all(label in r["metric"] for r in result), var["name"]


def test_the_alert_rules_evaluate_on_real_series(stack: Stack) -> None:
    stack.wait_for_series("run_id:anatomy_step_duration_seconds:median", FIRST_SCRAPE_S)
    with urllib.request.urlopen(f"{stack.prom_url}/api/v1/rules", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    rules = [rule for g in groups for rule in g["rules"]]
    assert len(rules) == 8
    assert all(rule["health"] == "ok" and not rule.get("lastError") for rule in rules), rules
    # A one-rank job is its own median: no straggler; a job that publishes is not stalled.
    assert all(rule["state"] == "inactive" for rule in rules if rule["type"] == "alerting")


def test_series_go_stale_when_the_job_exits(stack: Stack) -> None:
    stack.wait_for_series("anatomy_memory_bytes", FIRST_SCRAPE_S)
    assert stack.train is not None
    _stop(stack.train)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and stack.query("anatomy_memory_bytes"):
        time.sleep(0.5)
    assert stack.query("anatomy_memory_bytes") == [], "Prometheus still holds the exited job's series"
    assert stack.query("anatomy_rank_info") == []
    assert stack.query("anatomy_gpu_up")  # the GPUs are still there
    print(f"\nround trip: {stack.timings}")
