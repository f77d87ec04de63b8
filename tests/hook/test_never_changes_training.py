"""The hook observes without changing the training it watches: the user's saved-tensor hooks are called
exactly as without it, a compiled model stays compiled, and global state the user reads is untouched.
Each test runs the same loop with and without the hook and compares what the user can see."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import anatomy
from anatomy.vocabulary import Component

VOCAB = 2000
Calls = tuple[int, int]


def _batch(hk: SimpleNamespace, seq: int) -> dict[str, torch.Tensor]:
    b = hk.bert_batch(batch=2, seq=seq)
    b["input_ids"] = b["input_ids"] % VOCAB
    return b


def _user_hooks(calls: list[int]) -> contextlib.AbstractContextManager[Any]:
    def pack(t: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return t

    def unpack(t: torch.Tensor) -> torch.Tensor:
        calls[1] += 1
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def _save_on_cpu(calls: list[int]) -> contextlib.AbstractContextManager[Any]:
    """torch's own offloading context, its pack/unpack counted (it packs to ``(device, tensor)``)."""
    ctx = torch.autograd.graph.save_on_cpu()
    pack, unpack = ctx.pack_hook, ctx.unpack_hook

    def counted_pack(t: torch.Tensor) -> Any:
        calls[0] += 1
        return pack(t)

    def counted_unpack(packed: Any) -> torch.Tensor:
        calls[1] += 1
        return unpack(packed)

    ctx.pack_hook, ctx.unpack_hook = counted_pack, counted_unpack
    return ctx


def _run(
    hk: SimpleNamespace,
    hooked: bool,
    seqs: list[int],
    context: Callable[[list[int]], contextlib.AbstractContextManager[Any]],
) -> tuple[list[Calls], list[float], Any]:
    model = hk.small_bert(vocab=VOCAB)
    opt = torch.optim.AdamW(model.parameters())
    # sample_every=3: step 1 runs the op-group profiler and the per-op trace (alive saved tensors)
    tracker = anatomy.track(model, opt, publish=False, sample_every=3) if hooked else None
    calls_per_step: list[Calls] = []
    losses: list[float] = []
    torch.manual_seed(0)
    for seq in seqs:
        calls = [0, 0]
        with tracker.step() if tracker is not None else contextlib.nullcontext():
            with context(calls):
                loss = model(**_batch(hk, seq)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        calls_per_step.append((calls[0], calls[1]))
        losses.append(float(loss.detach()))
    snap = tracker.latest if tracker is not None else None
    if tracker is not None:
        tracker.close()
    return calls_per_step, losses, snap


@pytest.mark.parametrize("context", [_user_hooks, _save_on_cpu], ids=["user-pack-unpack", "save_on_cpu"])
@pytest.mark.parametrize("seqs", [[32] * 6, [16, 32, 48, 24, 40, 56]], ids=["fixed-shape", "varying-shape"])
def test_user_saved_tensor_hooks_are_called_as_without_the_hook(
    hk: SimpleNamespace, context: Callable[[list[int]], Any], seqs: list[int]
) -> None:
    without, losses_without, _ = _run(hk, False, seqs, context)
    with_hook, losses_with, snap = _run(hk, True, seqs, context)
    assert all(p > 0 and u > 0 for p, u in without)
    assert with_hook == without  # every step, counted or not, traced or not
    assert losses_with == losses_without
    # and the hook still measured: it counted what the user's pack returned
    _, _, plain = _run(hk, True, seqs, lambda calls: contextlib.nullcontext())
    assert snap is not None and plain is not None and snap.error is None
    assert snap.memory[Component.ACTIVATIONS.value] == plain.memory[Component.ACTIVATIONS.value] > 0


def test_a_pair_pushed_after_the_forward_is_left_alone(hk: SimpleNamespace) -> None:
    """The counting window may stay open after the forward (for the loss); a user's pair pushed then,
    and popped by the user, must pop the user's pair — never the hook's."""
    model = hk.small_bert(vocab=VOCAB)
    opt = torch.optim.AdamW(model.parameters())
    top = torch._C._autograd._top_saved_tensors_default_hooks
    with anatomy.track(model, opt, publish=False, sample_every=0) as tracker:
        for _ in range(3):
            calls = [0, 0]
            with tracker.step():
                out = model(**_batch(hk, 32))
                with _user_hooks(calls):
                    loss = out.loss + out.logits.pow(2).mean()  # pow saves: the user's pack runs
                loss.backward()
                opt.step()
                opt.zero_grad()
            assert calls[0] > 0 and calls[0] == calls[1]
            assert top(True) is None  # nothing of the hook's left on torch's stack between steps
    assert top(True) is None


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(32, 64)
        self.norm = torch.nn.LayerNorm(64)
        self.down = torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.norm(self.up(x))))  # type: ignore[no-any-return]


def _compiled_run(how: str, hooked: bool, steps: int = 7) -> tuple[list[int], list[str], Any]:
    """Calls into the compiled graph per step, through a counting torch.compile backend."""
    import warnings

    torch._dynamo.reset()
    calls: list[int] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        def run(*args: Any) -> Any:
            calls[-1] += 1
            return gm.forward(*args)

        return run

    model = _Block()
    if how == "model.compile":
        model.compile(backend=counting_backend)
        runs = model
    else:
        runs = torch.compile(model, backend=counting_backend)
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # sample_every=2: the op-group profiler and the per-op trace run on steps 1, 2, 4, 6
        tracker = anatomy.track(runs, opt, publish=False, sample_every=2) if hooked else None
        for _ in range(steps):
            calls.append(0)
            with tracker.step() if tracker is not None else contextlib.nullcontext():
                runs(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
        snap = tracker.latest if tracker is not None else None
        if tracker is not None:
            tracker.close()
    return calls, [str(w.message) for w in caught], snap


@pytest.mark.parametrize("how", ["torch.compile", "model.compile"])
def test_a_compiled_model_stays_compiled_on_every_step(how: str) -> None:
    without, _, _ = _compiled_run(how, hooked=False)
    with_hook, warned, snap = _compiled_run(how, hooked=True)
    assert without == [1] * len(without)
    assert with_hook == without  # old hook: [1, 0, 0, ...] -- eager from the first sampled step on
    assert not [w for w in warned if "hook" in w.lower()], warned  # no global module hooks
    assert snap is not None and snap.error is None
    assert snap.memory[Component.ACTIVATIONS.value]  # what the compiled graph saved for backward
    assert snap.op_groups_step is not None  # the sampled step ran, beside the compiled graph


def test_compiled_after_track_in_a_process_without_dynamo(tmp_path: Any) -> None:
    """A plain-torch script that tracks first, then compiles and creates its optimizer (Dynamo not loaded
    at track()): the hooks are wrapped at the next step boundary, before the compiled frame runs."""
    import subprocess
    import sys

    script = """
import sys, torch
import anatomy
calls = []
def counting_backend(gm, example_inputs):
    def run(*args):
        calls[-1] += 1
        return gm.forward(*args)
    return run
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 8)
    def forward(self, x):
        return self.down(torch.relu(self.up(x)))
model = Block()
tracker = anatomy.track(model, publish=False, sample_every=2)
assert "torch._dynamo" not in sys.modules  # (creating a torch optimizer loads it)
model.compile(backend=counting_backend)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
tracker.attach_optimizer(opt)
for _ in range(5):
    calls.append(0)
    with tracker.step():
        model(torch.randn(4, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
tracker.close()
print(calls, tracker.latest.error)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=str(tmp_path)
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1, 1, 1, 1, 1] None"
