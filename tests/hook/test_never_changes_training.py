"""The hook observes without changing the training it watches: the user's saved-tensor hooks are called
exactly as without it, a compiled model stays compiled, and global state the user reads is untouched.
Each test runs the same loop with and without the hook and compares what the user can see."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def _no_warnings_about_hooks() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    texts = [str(w.message) for w in caught]
    assert not [t for t in texts if "hook" in t.lower()], texts
