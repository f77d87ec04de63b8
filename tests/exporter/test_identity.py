"""The labels naming a training process's series: stable across restarts of a rank, unique per scrape."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import Any

from tui.exporter.identity import MAX_LABEL_CHARS, ProcessKey, assign_keys, base_key, label_value, parent_pid


def test_torchrun_run_id_and_rank_name_the_series(make_hello: Callable[..., Any]) -> None:
    # An elastic restart: same job, same rank, new PID -> the same series.
    before = base_key(make_hello(100, rank=3, local_rank=1, run_id="4f2a"))
    after = base_key(make_hello(200, rank=3, local_rank=1, run_id="4f2a"))
    assert before == after == ProcessKey(run_id="4f2a", rank="3")


def test_without_a_usable_run_id_the_launcher_names_the_job(make_hello: Callable[..., Any]) -> None:
    parents = {100: 7, 101: 7}
    keys = [base_key(make_hello(p, rank=r, run_id="none"), parents.get) for p, r in ((100, 0), (101, 1))]
    assert keys == [ProcessKey("local-7", "0"), ProcessKey("local-7", "1")]
    # No rank, no launcher: the process is its own run, rank 0.
    assert base_key(make_hello(555), parents.get) == ProcessKey("local-555", "0")
    # A rank whose parent cannot be read (another PID namespace): the process itself.
    assert base_key(make_hello(556, local_rank=2), lambda pid: None) == ProcessKey("local-556", "2")


def test_ties_go_to_the_first_started(make_hello: Callable[..., Any]) -> None:
    hellos = [
        make_hello(30, rank=0, run_id="x", started_at=3.0),
        make_hello(10, rank=0, run_id="x", started_at=1.0),
        make_hello(20, rank=1, run_id="x", started_at=2.0),
    ]
    assert assign_keys(hellos) == [
        ProcessKey("x-pid30", "0"),
        ProcessKey("x", "0"),
        ProcessKey("x", "1"),
    ]


def test_parent_pid_matches_the_kernel() -> None:
    child = subprocess.Popen(["sleep", "5"])
    try:
        assert parent_pid(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert parent_pid(child.pid) is None


def test_label_values_are_clean_and_bounded() -> None:
    assert label_value(None) == ""
    assert label_value("a\x1bb") == "a\\x1bb"
    long = label_value("y" * 1000)
    assert len(long) == MAX_LABEL_CHARS and long.endswith("…")
