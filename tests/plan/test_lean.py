"""The plan's own process imports lean (anatomy.plan.lean) and plans exactly as without it.

Each case runs in a fresh process: what lean_imports changes is process-wide, which is why only the
``anatomy-top plan`` process does it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
# torch's private modules by name: which of them a process has imported is what lean changes, and
# sys.modules is the only place that says so (no public way exists).
# Imported by transformers' model code only for what a plan never does (compiling, tensor parallelism,
# accelerate's loading): the lean process must not import them.
HEAVY = ("torch._dynamo.convert_frame", "torch._inductor", "accelerate")

_PLAN = """
import io, json, sys
from anatomy.plan.lean import dynamo_deferred
from anatomy.plan_cli import main
out = io.StringIO()
rc = main(sys.argv[1:], out=out, lean=True)
doc = json.loads(out.getvalue()) if rc == 0 else None
heavy = [m for m in sys.argv[0].split(",") if m in sys.modules]
dynamo = "torch._dynamo" in sys.modules
print(json.dumps({"rc": rc, "doc": doc, "heavy": heavy, "dynamo": dynamo, "deferred": dynamo_deferred()}))
"""


def _plan(argv: list[str], lean: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(REPO), ANATOMY_PLAN_LEAN="1" if lean else "0")
    script = _PLAN.replace("sys.argv[0]", repr(",".join(HEAVY)))
    done = subprocess.run(
        [sys.executable, "-c", script, *argv, "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rc"] == 0, done.stderr[-3000:]
    result["doc"].pop("elapsed_s", None)
    return result


@pytest.mark.parametrize(
    ("name", "extra", "lean_modules"),
    [
        ("bert", ["--quick", "--seq-len", "64"], True),
        ("llama", ["--quick", "--seq-len=64", "--lora=4", "--precision=bf16", "--target=cpu"], False),
    ],
)
def test_lean_process_plans_the_same(
    name: str, extra: list[str], lean_modules: bool, tmp_path: Path, tiny_configs: dict[str, Any]
) -> None:
    cfg = tiny_configs[name]
    cfg.save_pretrained(tmp_path / name)
    argv = [str(tmp_path / name), *extra]
    lean, full = _plan(argv, lean=True), _plan(argv, lean=False)
    assert lean["doc"] == full["doc"]
    assert full["dynamo"] and not full["deferred"]
    if lean_modules:  # PEFT imports accelerate itself
        assert lean["heavy"] == []
        assert lean["dynamo"] and lean["deferred"]
        assert "accelerate" in full["heavy"]


def test_deferred_dynamo_runs_the_real_package_when_used() -> None:
    # torch._dynamo and FakeTensorMode (torch._subclasses) have no public name: the deferred package is
    # what is under test, and FakeTensorMode is the plan's own user of it.
    script = """
import sys, torch
from anatomy.plan.lean import dynamo_deferred, lean_imports
assert lean_imports()
assert dynamo_deferred()
f = torch.compiler.disable(lambda x: x + 1)  # a stand-in: no compiler imported
assert f(1) == 2 and "torch._dynamo.convert_frame" not in sys.modules
from transformers import masking_utils  # imports a torch._dynamo submodule on its own
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode(allow_non_fake_inputs=True):  # imports torch._dynamo.config; a constant: .source
    assert (torch.ones(3) + torch.tensor([1.0, 2.0, 3.0])).shape == (3,)
assert "torch._dynamo.source" in sys.modules and "torch._dynamo.convert_frame" not in sys.modules
compiled = torch.compile(lambda x: x * 2, backend="eager")  # anything else: the real package
assert compiled(torch.ones(2)).tolist() == [2.0, 2.0]
assert not dynamo_deferred() and torch._dynamo is sys.modules["torch._dynamo"]
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=str(REPO), ANATOMY_PLAN_LEAN="1")
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
