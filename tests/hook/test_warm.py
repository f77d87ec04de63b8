"""anatomy.hook.warm: the sampled steps' first-time costs paid by ``track()``, where nothing of the user's
sees it. Each case runs in a fresh process (the warm-up runs once per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PRELUDE = """
import json, sys, tempfile
from pathlib import Path
import torch
import anatomy
from anatomy.hook import opgroups, trace
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
"""


def _run(body: str) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), ANATOMY_TOP_RECORD="0")
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE + body], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _names() -> str:
    return "sorted({p[2] for p in opgroups._PLANS.values()})"


def test_track_plans_the_common_ops_and_leaves_the_users_state_as_it_was() -> None:
    """After ``track()`` the profiler and the trace know a model's usual ops (linear, its backward, an Adam
    update), and the generator, grad mode and every stack are as the user left them."""
    out = _run(
        f"""
opt = torch.optim.AdamW(model.parameters())  # (imports torch's compiler, as it does)
rng = torch.get_rng_state()
torch.set_grad_enabled(False)
tracker = anatomy.track(model, opt, directory=Path(tempfile.mkdtemp()))
out = dict(
    planned={_names()},
    allocates=len(trace._ALLOCATES),
    rng_same=bool(torch.equal(rng, torch.get_rng_state())),
    grad=torch.is_grad_enabled(),
    dispatch=torch._C._len_torch_dispatch_stack(),
    function=torch._C._len_torch_function_stack(),
    hooks=torch._C._autograd._top_saved_tensors_default_hooks(False) is None,
)
tracker.close()
print(json.dumps(out))
"""
    )
    planned = out["planned"]
    assert isinstance(planned, list)
    for op in ("addmm", "mm", "t", "relu", "threshold", "sum", "lerp", "addcmul", "addcdiv", "_foreach_mul"):
        assert op in planned, (op, planned)
    assert isinstance(out["allocates"], int) and out["allocates"] >= 30
    assert out["rng_same"] is True
    assert out["grad"] is False  # (set off by the user before track(): still off)
    assert out["dispatch"] == 0 and out["function"] == 0 and out["hooks"] is True


def test_nothing_runs_under_the_users_modes_or_saved_tensor_hooks() -> None:
    """A dispatch mode or saved-tensor hooks of the user's around ``track()``: they see no op of the
    warm-up's (the mode sees what a set-up without it runs), and the warm-up is left to a later tracker's."""
    out = _run(
        f"""
from torch.utils._python_dispatch import TorchDispatchMode
opt = torch.optim.SGD(model.parameters(), lr=0.1)
seen = []
class Mine(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        seen.append(str(func))
        return func(*args, **(kwargs or {{}}))
packed = []
def pack(t):
    packed.append(tuple(t.shape))
    return t
with Mine():  # (the set-up's own ops, as without a warm-up: sampling off)
    anatomy.track(model, opt, directory=Path(tempfile.mkdtemp()), publish=False, sample_every=0).close()
without = list(seen)
seen.clear()
with Mine():
    t1 = anatomy.track(model, opt, directory=Path(tempfile.mkdtemp()), publish=False)
under_mode = {_names()}
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    t2 = anatomy.track(model, opt, directory=Path(tempfile.mkdtemp()), publish=False)
under_hooks = {_names()}
t3 = anatomy.track(model, opt, directory=Path(tempfile.mkdtemp()), publish=False)
later = {_names()}
for t in (t1, t2, t3):
    t.close()
out = dict(seen=seen, without=without, packed=packed)
out.update(under_mode=under_mode, under_hooks=under_hooks, later=later)
print(json.dumps(out))
"""
    )
    assert out["seen"] == out["without"] and out["packed"] == []
    assert out["under_mode"] == [] and out["under_hooks"] == []
    later = out["later"]
    assert isinstance(later, list) and "addmm" in later  # (the first quiet set-up warmed them)


def test_a_process_without_torchs_compiler_is_not_made_to_import_it() -> None:
    """No optimizer and no transformers model: torch's compiler is not imported, and ``track()`` does not
    import it (a mode's first op would: ~2 s) — the warm-up waits."""
    out = _run(
        f"""
before = "torch._dynamo" in sys.modules
tracker = anatomy.track(model, None, directory=Path(tempfile.mkdtemp()), publish=False)
print(json.dumps(dict(before=before, after="torch._dynamo" in sys.modules, planned={_names()})))
tracker.close()
"""
    )
    assert out["before"] is False and out["after"] is False and out["planned"] == []
