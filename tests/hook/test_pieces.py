"""A deep model's sampled work in pieces over consecutive steps: the pieces add up to the whole step's op
groups exactly, the trace's pieces to a split at the peak; nothing is left behind and training is bit for
bit what it is without the hook."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import anatomy
from anatomy.hook.opgroups import OpGroupProfiler
from anatomy.hook.pieces import MIN_BLOCKS, repeated_blocks
from anatomy.vocabulary import Phase

DEPTH = 8
STEPS = 80  # (the windows test: every window of both instruments within them)


def _llama(depth: int = DEPTH) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=depth,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=16,
    )
    return LlamaForCausalLM(cfg)


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> float:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return float(loss.item())


def test_the_blocks_are_the_longest_run_of_one_class() -> None:
    llama = _llama()
    assert repeated_blocks(llama) == list(llama.model.layers)
    blocks = [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()) for _ in range(MIN_BLOCKS)]
    mlp = torch.nn.Sequential(*blocks)
    assert repeated_blocks(mlp) == list(mlp)
    assert repeated_blocks(torch.nn.Sequential(*blocks[1:])) == []  # a shallow stack: instrumented whole
    assert repeated_blocks(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))) == []


def test_pieces_add_up_to_the_whole_steps_op_groups_and_leave_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The FLOPs of every op group, profiled a piece a step (a run of blocks forward and backward, then the
    optimizer), equal a whole step's profiled at once; the trace's pieces give a split at the peak that
    sums to it. Losses are bit-identical with a run without the hook, and no hook or mode is left."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:  # as where nothing was compiled (an earlier test's frames turn the norm watch off)
        monkeypatch.setitem(dynamo.utils.counters["frames"], "ok", 0)
    ids = _ids()
    reference = _llama()
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    ref_losses = [_step(reference, ref_opt, ids) for _ in range(30)]

    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    whole: Any = None
    losses = []
    with anatomy.track(model, opt, publish=False, record=False, sample_every=1000) as tracker:
        for i in range(30):
            with tracker.step():
                losses.append(_step(model, opt, ids))
            if i == 0:  # a whole step profiled at once, outside the tracker's steps (same shapes, same ops)
                prof = OpGroupProfiler(model.modules())
                with prof:
                    out = model(input_ids=ids, labels=ids).loss
                    out.backward()
                    prof.set_phase(Phase.OPTIMIZER)
                    torch.optim.AdamW(model.parameters(), lr=0.0).step()  # (lr 0: the same ops, no update)
                model.zero_grad()
                whole = prof.result()
        history = list(tracker.history)
    assert losses == ref_losses
    profiled = [s for s in history if s.op_groups_step is not None]
    assert profiled, "the op groups never completed"
    done = min(s.op_groups_step for s in profiled if s.op_groups_step is not None)
    assert 1 < done < 30  # more than one piece, all on consecutive steps from step 1
    snap = next(s for s in history if s.step == done)
    assert snap.op_groups is not None and whole is not None
    for group, stat in whole.items():
        if group.value == "optimizer":
            continue  # (the reference step's optimizer is a fresh one: its first step makes its states)
        assert snap.op_groups[group].flops == stat.flops, group
        assert (snap.op_groups[group].time_s or 0) > 0 or not stat.time_s
    traced = [s for s in history if s.at_peak_step is not None and s.at_peak_step > done]
    assert traced, "the trace's pieces never completed"
    last = traced[-1]
    assert last.at_peak is not None and sum(v or 0 for v in last.at_peak.values()) == last.peak_bytes
    assert not _get_current_dispatch_mode_stack()
    for block in repeated_blocks(model):
        assert not block._forward_pre_hooks and not block._forward_hooks  # (torch keeps them only there)


def test_accumulators_held_elsewhere_keep_no_hook_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    """DDP's reducer holds every parameter's gradient accumulator for the whole run, so a hook on one
    outlives the graph. After episodes of pieces and traced steps, a later backward runs no code of ours
    (before: one call per parameter per piece that ever ran, for the rest of the run)."""
    from torch.autograd.graph import get_gradient_edge

    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:  # (as in the test above)
        monkeypatch.setitem(dynamo.utils.counters["frames"], "ok", 0)
    model = _llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    held = [get_gradient_edge(p).node for p in model.parameters()]  # (what DDP's reducer keeps)
    ids = _ids()
    pieces = 0
    original = anatomy.hook.pieces.Piece._hook_backward

    def counted(self: Any, outputs: Any, seq0: int, seq1: int) -> None:
        nonlocal pieces
        pieces += 1
        original(self, outputs, seq0, seq1)

    monkeypatch.setattr(anatomy.hook.pieces.Piece, "_hook_backward", counted)
    with anatomy.track(model, opt, publish=False, record=False, sample_every=8) as tracker:
        for _ in range(40):
            with tracker.step():
                _step(model, opt, ids)
    assert pieces > 2, "no episode of pieces ran"
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and "/anatomy/" in frame.f_code.co_filename:
            calls.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        _step(model, opt, ids)
    finally:
        sys.setprofile(None)
    assert calls == []
    del held  # (held to the end, as DDP holds them)


def test_held_accumulators_are_those_something_else_keeps() -> None:
    """A parameter's gradient accumulator is held while DDP's reducer or a graph still alive keeps it; asking
    leaves none made and no mark behind."""
    from torch.autograd.graph import get_gradient_edge

    from anatomy.hook.pieces import _MARK, held_accumulators

    free, kept, graphed, frozen = (torch.nn.Parameter(torch.randn(3)) for _ in range(4))
    frozen.requires_grad_(False)
    node = get_gradient_edge(kept).node
    out = (graphed * 2).sum()
    assert held_accumulators([free, kept, graphed, frozen]) == {id(kept), id(graphed)}
    assert _MARK not in node.metadata
    del out
    assert held_accumulators([graphed]) == frozenset()


def _mlp(depth: int = DEPTH) -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = [
        torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16))
        for _ in range(depth)
    ]
    return torch.nn.Sequential(*blocks)


def _mlp_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, around: AbstractContextManager[Any]
) -> float:
    """A step, its optimizer's under ``around`` (a user's mode, a profiler, nothing)."""
    loss = model(x).pow(2).mean()
    loss.backward()
    with around:
        opt.step()
    opt.zero_grad()
    return float(loss.item())


@contextmanager
def _profiled_optimizer(prof: OpGroupProfiler) -> Iterator[None]:
    with prof:
        prof.set_phase(Phase.OPTIMIZER)
        yield


class _Addcdivs(TorchFunctionMode):
    """A user's function mode: counts the optimizer's ``addcdiv_`` calls (one per parameter per step)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") == "addcdiv_":
            self.seen += 1
        return func(*args, **(kwargs or {}))


def test_the_optimizers_step_in_windows_adds_up_to_the_whole_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """An optimizer looping over its parameters (single-tensor AdamW) is instrumented in windows of its
    calls over consecutive steps, each starting where the last closed: the optimizer group's FLOPs over
    the windows equal one whole optimizer step's, profiled at once in a run without the hook; the trace's
    windows complete too. Losses are bit-identical, a user's function mode around the optimizer sees every
    call it sees without the hook, and no mode is left on either stack."""
    from anatomy.hook.pieces import Piece
    from anatomy.vocabulary import OpGroup

    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:  # (as where nothing was compiled: there the optimizer's step is whole)
        monkeypatch.setitem(dynamo.utils.counters["frames"], "ok", 0)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    reference = _mlp()
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3, foreach=False)
    ref_user = _Addcdivs()
    prof = OpGroupProfiler(())
    ref_losses = [
        # (at step 5 a whole optimizer step profiled at once: its states exist since step 0)
        _mlp_step(reference, ref_opt, x, _profiled_optimizer(prof) if i == 5 else ref_user)
        for i in range(STEPS)
    ]
    whole = prof.result()

    windows: list[tuple[int, int | None, int]] = []
    original = Piece.close

    def close(self: Piece) -> None:
        if self.optimizer:
            windows.append((self.call_first, self.calls_left, self.calls))
        original(self)

    monkeypatch.setattr(Piece, "close", close)
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    user = _Addcdivs()
    losses = []
    with anatomy.track(model, opt, publish=False, record=False, sample_every=1000) as tracker:
        for i in range(STEPS):
            with tracker.step():  # (as the reference: step 5's optimizer out of the user's mode)
                losses.append(_mlp_step(model, opt, x, nullcontext() if i == 5 else user))
            assert not _get_current_dispatch_mode_stack()
            assert torch._C._len_torch_function_stack() == 0
        history = list(tracker.history)
    assert losses == ref_losses
    assert user.seen == ref_user.seen == (STEPS - 1) * len(list(model.parameters()))
    assert len(windows) >= 3, windows  # the profiler's windows, then the trace's
    first_round = []
    for start, rest, _ in windows:
        first_round.append((start, rest))
        if rest is None:
            break
    assert len(first_round) >= 2 and first_round[0][0] == 0, windows
    for (_, rest), (start, _) in itertools.pairwise(first_round):
        assert rest == start  # each window starts where the last closed
    assert all(calls == windows[0][2] for _, _, calls in windows)  # the same calls every step
    profiled = [s for s in history if s.op_groups_step is not None]
    assert profiled and whole is not None, windows
    snap = next(s for s in history if s.step == min(s.op_groups_step or 0 for s in profiled))
    assert snap.op_groups is not None
    assert snap.op_groups[OpGroup.OPTIMIZER].flops == whole[OpGroup.OPTIMIZER].flops > 0
    for group, stat in whole.items():
        if group is not OpGroup.OPTIMIZER:
            assert snap.op_groups[group].flops >= stat.flops  # (the forward and backward ran too)
    traced = [s for s in history if s.at_peak_step is not None and s.at_peak_step > snap.step]
    assert traced, "the trace's windows never completed"


def test_the_plan_moves_through_the_optimizers_windows() -> None:
    from anatomy.hook.pieces import PiecePlan

    blocks = list(_mlp(MIN_BLOCKS))
    plan = PiecePlan(blocks, per_piece=MIN_BLOCKS)
    assert plan.next() == (0, MIN_BLOCKS, False)
    plan.finished(0, MIN_BLOCKS, False, None)
    assert plan.next() == (MIN_BLOCKS, MIN_BLOCKS, True) and plan.next_call == 0
    plan.finished(MIN_BLOCKS, MIN_BLOCKS, True, None, call_stop=40)
    assert not plan.done and plan.next_call == 40
    plan.finished(MIN_BLOCKS, MIN_BLOCKS, True, None, call_stop=40)  # (no progress: the plan ends)
    assert plan.done
    plan = PiecePlan(blocks, per_piece=MIN_BLOCKS)
    plan.finished(0, MIN_BLOCKS, False, None)
    plan.finished(MIN_BLOCKS, MIN_BLOCKS, True, None, call_stop=None)  # the window ran to the end
    assert plan.done


def test_an_optimizer_piece_is_whole_without_a_window() -> None:
    """With a window, the optimizer's piece puts a function mode on (the instrument only around the calls
    in it); without (anything compiled: Dynamo would trace a function mode), the instrument itself, as
    before the windows."""
    from anatomy.hook.pieces import Piece

    blocks = list(_mlp(MIN_BLOCKS))
    for window_s, function_modes, dispatch_modes in ((1.0, 1, 0), (float("inf"), 0, 1)):
        prof = OpGroupProfiler(())
        piece = Piece(prof, blocks, MIN_BLOCKS, MIN_BLOCKS, optimizer=True, window_s=window_s)
        piece.open()
        x = torch.ones(3)
        piece.optimizer_begins()
        assert torch._C._len_torch_function_stack() == function_modes
        assert len(_get_current_dispatch_mode_stack()) == dispatch_modes
        (x * 2).sum()
        piece.optimizer_ends()
        piece.close()
        assert torch._C._len_torch_function_stack() == 0 and not _get_current_dispatch_mode_stack()
        assert prof.op_count == 2  # (mul, sum: in the window, or under the whole step's mode)
        assert piece.calls_left is None


def test_an_error_in_the_optimizers_window_leaves_the_instrument_off() -> None:
    """A call in the window that raises: the instrument is off before the error reaches the user's code
    (their handler runs without it), the window is closed there, and the piece ends clean."""
    from anatomy.hook.pieces import Piece

    prof = OpGroupProfiler(())
    piece = Piece(prof, list(_mlp(MIN_BLOCKS)), MIN_BLOCKS, MIN_BLOCKS, optimizer=True, window_s=1.0)
    piece.open()
    x = torch.ones(3)
    piece.optimizer_begins()
    x.mul_(2)
    assert len(_get_current_dispatch_mode_stack()) == 1  # (on for the window's calls)
    with pytest.raises(RuntimeError):
        x.view(2, 2)  # (3 elements: torch refuses)
    assert not _get_current_dispatch_mode_stack()
    piece.optimizer_ends()
    piece.close()
    assert torch._C._len_torch_function_stack() == 0 and not _get_current_dispatch_mode_stack()
