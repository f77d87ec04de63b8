"""Ordinary steps with the model's forward hooks off (anatomy.hook.ordinary: "resting"): where a step is
given what its batch would tell (its samples; its tokens, if the batch has any), its forward runs
unwatched between the steps that look — and the history comes out as it does with the forward watched on
every step."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
import torch

import anatomy
from anatomy.hook import resting
from anatomy.hook.rest_gate import StepCount
from anatomy.vocabulary import Component
from tests.hook.test_lean_steps import (
    _PER_RUN,
    _TENSOR_SUMS,
    _closure,
    _mlp,
    _no_grad_forward_first,
    _usual,
)

pytestmark = pytest.mark.usefixtures("nothing_compiled")  # (tests/conftest.py)


def _watched(model: torch.nn.Module) -> bool:
    """Are the tracker's forward hooks on the model now (the only forward hooks these tests put there)?"""
    return bool(model._forward_pre_hooks) and bool(model._forward_hooks)


def test_a_step_given_its_samples_runs_its_forward_unwatched_and_shows_the_last_split() -> None:
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    watched: list[bool] = []
    for _ in range(20):
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, opt, x)
    built = tracker.history[2]  # (the steps that end in full are watched: the first ones, the looks)
    snap = tracker.latest
    tracker.close()
    assert watched[:3] == [True] * 3 and not any(watched[4:]), watched
    assert not _watched(model)  # (closed: nothing of ours stays)
    assert snap is not None and snap.step == 19 and snap.timing.step_s is not None
    assert snap.timing.optimizer_s is not None and snap.timing.samples_per_s is not None
    assert snap.timing.samples_per_s == pytest.approx(8 / snap.timing.step_s)
    assert built.timing.forward_s is not None and built.timing.backward_s is not None
    t, b = snap.timing, built.timing
    assert t.forward_s is not None and t.backward_s is not None and t.optimizer_s is not None
    assert b.step_s is not None and b.optimizer_s is not None
    scale = (t.step_s - t.optimizer_s) / (b.step_s - b.optimizer_s)  # (the build's, scaled: test_step_feed)
    assert t.forward_s == pytest.approx(b.forward_s * scale) and t.backward_s == pytest.approx(
        b.backward_s * scale
    )
    assert t.forward_s + t.backward_s + t.optimizer_s <= t.step_s * (1 + 1e-9)


def test_where_the_batch_tells_the_tokens_the_forward_stays_watched_unless_the_step_is_given_them() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Flatten(), torch.nn.Linear(8 * 6, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    ids = torch.randint(0, 32, (4, 6))
    watched: list[bool] = []
    for i in range(24):
        tokens = 24 if i >= 12 else None
        with tracker.step(samples=4, tokens=tokens):
            watched.append(_watched(model))
            _usual(model, opt, ids)
    snap = tracker.latest
    tracker.close()
    assert all(watched[:12]) and not any(watched[12:]), watched
    assert snap is not None and snap.timing.tokens_per_s == pytest.approx(24 / (snap.timing.step_s or 1.0))


def _special_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, tracker: Any) -> dict[str, Any]:
    """Every kind of step test_lean_steps.py runs but a second forward and a new batch shape (which a
    resting step does not see: the next look does), each given its samples."""
    x = torch.randn(8, 16)

    def with_closure() -> None:
        with tracker.step(samples=8):
            _closure(model, opt, x)

    def backward_end() -> None:
        with tracker.step(samples=8):
            model(x).sum().backward()
            tracker.backward_end()  # a framework's callback (the Trainer's on_substep_end)
            opt.step()
            opt.zero_grad()

    def no_update() -> None:
        with tracker.step(samples=8):  # a block without an update: the step goes on in the next one
            model(x).sum().backward()

    def raising() -> None:
        try:
            with tracker.step(samples=8):
                model(x).sum().backward()
                raise ValueError("the user's own")
        except ValueError:
            opt.zero_grad()

    def by_hand() -> None:
        tracker.begin_step(samples=8)  # begin/end by hand, as a framework does
        _usual(model, opt, x)
        tracker.end_step()

    def trainer() -> None:
        tracker.begin_step(samples=8)  # the Hugging Face Trainer's calls around the optimizer's own hooks
        model(x).sum().backward()
        tracker.optimizer_begin()
        opt.step(closure=None)
        tracker.optimizer_end()
        opt.zero_grad()
        tracker.end_step()

    def no_grad_first() -> None:
        with tracker.step(samples=8):
            _no_grad_forward_first(model, opt, x)

    def unsized() -> None:
        with tracker.step():  # not told its samples: this one watches its forward
            _usual(model, opt, x)

    return {
        "unsized": unsized,
        "closure": with_closure,
        "backward_end": backward_end,
        "no_update": no_update,
        "raising": raising,
        "by_hand": by_hand,
        "trainer": trainer,
        "no_grad_first": no_grad_first,
    }


def _optimizer(kind: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    """Optimizers whose update moves no parameter's version counter: torch's fused AdamW (a step count
    tensor), bitsandbytes' 8-bit AdamW and its paged one (a Python int)."""
    if kind == "fused":
        return torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    import bitsandbytes as bnb

    return getattr(bnb.optim, kind)(model.parameters(), lr=1e-3, min_8bit_size=0)  # type: ignore[no-any-return]


def _run(
    rest: bool, special: str, monkeypatch: pytest.MonkeyPatch, optimizer: str | None = None
) -> tuple[list[dict[str, Any]], float, list[bool]]:
    """Usual steps (resting from the fourth on), the special one, usual steps. ``optimizer``: one of
    :func:`_optimizer`'s (None: the MLP's SGD)."""
    monkeypatch.setattr(resting, "REST_ON", rest)
    model, opt = _mlp()
    if optimizer is not None:
        opt = _optimizer(optimizer, model)
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    watched: list[bool] = []
    body = _special_steps(model, opt, tracker)[special]
    for i in range(10):
        if i == 6:
            watched.append(_watched(model))
            body()
            continue
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, opt, x)
    loss = float(model(x).sum().detach())
    history = []
    for snap in tracker.history:
        fields = {k: v for k, v in dataclasses.asdict(snap).items() if k not in _PER_RUN}
        fields["memory"] = {c: v if c in _TENSOR_SUMS else v is not None for c, v in snap.memory.items()}
        history.append(fields)
    tracker.close()
    return history, loss, watched


@pytest.mark.parametrize(
    "special",
    ["unsized", "closure", "backward_end", "no_update", "raising", "by_hand", "trainer", "no_grad_first"],
)
def test_a_resting_step_of_any_kind_comes_out_as_a_watched_one(
    special: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    watched, watched_loss, always = _run(False, special, monkeypatch)
    resting, resting_loss, rested = _run(True, special, monkeypatch)
    assert all(always) and not any(rested[3:7]), rested  # (the special step began unwatched)
    assert resting_loss == watched_loss
    assert [s["step"] for s in resting] == [s["step"] for s in watched]
    for a, b in zip(resting, watched, strict=True):
        assert a == b, a["step"]


@pytest.mark.parametrize("special", ["no_update", "raising", "trainer", "closure", "by_hand"])
def test_under_a_fused_optimizer_steps_rest_on_its_step_count_and_come_out_as_watched_ones(
    special: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's fused AdamW (the Trainer's default optimizer) updates the parameters in its kernel without
    moving their version counters: the look that sees it learns the probe's step count in the optimizer's
    state instead, and the steps after the next look rest on it, every snapshot as a watched run's."""
    watched, watched_loss, always = _run(False, special, monkeypatch, "fused")
    resting_, resting_loss, rested = _run(True, special, monkeypatch, "fused")
    assert all(always) and not any(rested[3:7]), rested
    assert resting_loss == watched_loss
    assert [s["step"] for s in resting_] == [s["step"] for s in watched]
    for a, b in zip(resting_, watched, strict=True):
        assert a == b, a["step"]


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("optimizer", ["AdamW8bit", "PagedAdamW8bit"])
@pytest.mark.parametrize("special", ["usual", "no_update", "raising", "trainer"])
def test_an_optimizer_that_counts_its_steps_in_a_python_int_lets_steps_rest(
    optimizer: str, special: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bitsandbytes' optimizers (on CUDA a kernel called by pointer: no tensor's version moves; on the CPU
    here the parameter's stays too) keep their step count as a Python int in the optimizer's state: the look
    learns it (rest_gate.StepCount), and the steps after the next look rest on it, every snapshot as a
    watched run's."""
    if special == "usual":
        special = "by_hand"
    watched, watched_loss, always = _run(False, special, monkeypatch, optimizer)
    resting_, resting_loss, rested = _run(True, special, monkeypatch, optimizer)
    assert all(always) and not any(rested[3:7]), rested
    assert resting_loss == watched_loss
    assert [s["step"] for s in resting_] == [s["step"] for s in watched]
    for a, b in zip(resting_, watched, strict=True):
        assert a == b, a["step"]


def _told_steps(
    steps: int, interval_s: float, optimizer: str = "fused"
) -> tuple[torch.nn.Module, Any, Any, torch.Tensor]:
    """A tracker of the MLP under one of :func:`_optimizer`'s (torch's fused AdamW unless said), after
    ``steps`` usual steps told their samples."""
    model, _ = _mlp()
    opt = _optimizer(optimizer, model)
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=interval_s)
    x = torch.randn(8, 16)
    for _ in range(steps):
        with tracker.step(samples=8):
            _usual(model, opt, x)
    return model, opt, tracker, x


def test_a_fused_optimizer_made_anew_while_steps_rest_is_adopted_and_its_steps_rest_again() -> None:
    """The witness (the old optimizer's step count) moves no more once the loop steps a new fused AdamW it
    did not tell the tracker of: the next resting step goes the watched way, the look adopts the optimizer,
    and once its step count is learned the steps rest again."""
    model, _, tracker, x = _told_steps(8, interval_s=0.02)
    new = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    began = time.perf_counter()
    while time.perf_counter() - began < 5.0 and tracker._optimizer is not new:
        with tracker.step(samples=8):
            _usual(model, new, x)
    watched: list[bool] = []
    began = time.perf_counter()
    while time.perf_counter() - began < 5.0 and (len(watched) < 3 or watched[-1]):
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, new, x)
    snap = tracker.latest
    tracker.close()
    assert tracker._optimizer is new and not watched[-1], watched
    states = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    counts = sum(t.numel() * t.element_size() for st in new.state.values() for t in [st["step"]])
    assert snap is not None and snap.memory[Component.OPTIMIZER_STATES] == states + counts


def test_the_witness_is_the_step_count_the_optimizer_holds() -> None:
    """A look whose update moved no version keeps a step count the optimizer still holds (a sampled step:
    a foreach op under a dispatch mode moves no version either), takes a new optimizer's, and goes back to
    the probe parameter where the optimizer keeps no step count."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    model, opt, tracker, x = _told_steps(6, interval_s=3600.0)
    probe = tracker._probe_ref()
    count = opt.state[probe]["step"]
    assert tracker._witness_ref() is count
    version = count._version
    model(x).sum().backward()
    with Mode():  # (the update under a dispatch mode: its step count's version stays)
        opt.step()
    assert count._version == version
    tracker._learn_witness(probe, count)
    assert tracker._witness_ref() is count
    new = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    new.step()
    tracker.attach_optimizer(new)
    tracker._learn_witness(probe, count)
    assert tracker._witness_ref() is new.state[probe]["step"]
    tracker.attach_optimizer(torch.optim.SGD(model.parameters(), lr=1e-3))
    tracker._learn_witness(probe, tracker._witness_ref())
    assert tracker._witness_ref() is probe
    tracker.close()


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
def test_a_step_count_kept_as_an_int_is_read_by_weak_references() -> None:
    """The witness of bitsandbytes' 8-bit AdamW reads the probe's step count in its state as the steps go,
    and holds neither the optimizer nor the parameter: once both are dropped it is gone (-1, None)."""
    import gc
    import weakref

    _, opt, tracker, _ = _told_steps(6, 3600.0, "AdamW8bit")
    witness = tracker._witness_ref
    probe = tracker._probe_ref()
    assert isinstance(witness, StepCount) and witness() is witness
    assert witness._version == opt.state[probe]["step"] == 6
    tracker.close()
    gone = weakref.ref(opt)
    del tracker, opt, probe
    gc.collect()
    assert gone() is None and witness() is None and witness._version == -1


def test_a_step_of_other_samples_is_watched_and_counts_its_batch() -> None:
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x, wide = torch.randn(8, 16), torch.randn(12, 16)
    watched: list[bool] = []
    for batch in [x] * 8 + [wide] * 4:
        with tracker.step(samples=len(batch)):
            watched.append(_watched(model))
            _usual(model, opt, batch)
    history = list(tracker.history)
    tracker.close()
    # The gate lets no step through whose samples are not the build's: the wide batch's first step is
    # watched from its start, its batch counted there.
    assert not watched[7] and watched[8], watched
    acts = [s.memory[Component.ACTIVATIONS] for s in history]
    assert acts[8] is not None and acts[7] is not None and acts[8] == acts[7] * 12 // 8  # counted anew
    assert [s.batch_size for s in history][8:] == [12] * 4


class _Sliced(torch.nn.Module):
    """Runs its layers through a new ModuleList every forward, as Hugging Face models slice theirs."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:3]:
            x = torch.relu(layer(x))
        return x


def test_the_registration_watch_rests_with_the_forward_and_sees_a_module_assigned_between_steps() -> None:
    torch.manual_seed(0)
    model = _Sliced()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    for _ in range(6):
        with tracker.step(samples=8):
            _usual(model, opt, x)
    assert tracker._model_watch.suspect is False and not _watched(model)
    weights = tracker.latest.memory[Component.WEIGHTS] if tracker.latest else None
    model.head = torch.nn.Linear(16, 16)  # assigned between steps: seen
    opt.add_param_group({"params": model.head.parameters()})
    with tracker.step(samples=8):
        watched = _watched(model)
        (model.head(model(x))).sum().backward()
        opt.step()
        opt.zero_grad()
    snap = tracker.latest
    tracker.close()
    head = sum(p.numel() * p.element_size() for p in model.head.parameters())
    assert watched and snap is not None and weights is not None
    assert snap.memory[Component.WEIGHTS] == weights + head


def test_once_anything_is_compiled_the_forward_stays_watched_from_the_next_look() -> None:
    """Dynamo guards on a traced module's hooks: taking ours off and putting them back would recompile. A
    frame compiled while steps rest was traced without them either way (its step began before it), so it is
    looked for at the next look, not on every step: from there the hooks stay on."""
    import torch._dynamo

    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=0.02)
    x = torch.randn(8, 16)
    watched: list[bool] = []
    compiled_at = 0.0
    for i in range(20000):
        if i == 6:
            torch._dynamo.utils.counters["frames"]["ok"] += 1  # (a frame compiled somewhere in the process)
            compiled_at = time.perf_counter()
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, opt, x)
        if i > 6 and time.perf_counter() - compiled_at > 1.0 and watched[-1]:
            break
    tracker.close()
    assert not any(watched[3:7]), watched[:8]
    assert watched[-1], "no look within a second of 0.02 s publish intervals"
    look = watched.index(True, 7)
    assert all(watched[look:]) and len(watched) - look > 10, (look, len(watched))


def test_a_rebuild_due_while_resting_waits_for_a_look_and_every_snapshot_has_the_split() -> None:
    """A snapshot is built anew at least every few publish intervals; a resting step has no forward times
    to build with, so the rebuild waits for the next step that looks."""
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=0.01)
    x = torch.randn(8, 16)
    watched: list[bool] = []
    deadline = time.perf_counter() + 0.5  # (50 publish intervals: several rebuilds due)
    while time.perf_counter() < deadline:
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, opt, x)
            time.sleep(0.0005)
    history = list(tracker.history)
    tracker.close()
    assert len(history) >= 40 and sum(not w for w in watched) >= 10, watched
    assert all(s.timing.forward_s is not None and s.timing.backward_s is not None for s in history[1:])


def _ours_global_pre_hooks() -> int:
    from torch.optim import optimizer as torch_optimizer

    return len(torch_optimizer._global_optimizer_pre_hooks)


def test_a_resting_step_runs_under_no_hook_of_ours_and_a_look_puts_every_one_back() -> None:
    """Between looks neither the model nor the optimizer (nor torch's global optimizer hooks) holds a hook
    of ours; the user's own hooks fire on every step as without us."""
    model, opt = _mlp()
    fired: list[str] = []
    model.register_forward_hook(lambda *_: fired.append("forward"))
    opt.register_step_post_hook(lambda *_: fired.append("step"))
    before = (_ours_global_pre_hooks(), len(opt._optimizer_step_post_hooks), len(model._forward_hooks))
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    seen: list[tuple[int, int, int]] = []
    for _ in range(12):
        with tracker.step(samples=8):
            seen.append(
                (_ours_global_pre_hooks(), len(opt._optimizer_step_post_hooks), len(model._forward_hooks))
            )
            _usual(model, opt, x)
    history = list(tracker.history)
    tracker.close()
    assert seen[0] == (before[0] + 1, before[1] + 1, before[2] + 1)  # (a step that looks: all of ours)
    assert seen[4:] == [before] * 8, seen  # resting: none of ours
    assert (_ours_global_pre_hooks(), len(opt._optimizer_step_post_hooks)) == before[:2]
    assert fired == ["forward", "step"] * 12
    assert [s.step for s in history] == list(range(12))


class _Replacing(torch.optim.Optimizer):
    """Plain SGD that replaces each parameter's data (no in-place update: its version counter stays)."""

    def __init__(self, params: Any, lr: float = 1e-3) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data = p.data - group["lr"] * p.grad


@pytest.mark.parametrize("kind", ["replacing", "fused SGD"])
def test_an_optimizer_whose_update_moves_no_version_counter_never_lets_a_step_rest(kind: str) -> None:
    """A resting step's update is seen by a version counter: the probe parameter's, or its step count in the
    optimizer's state. Where the step that looks sees an update that moved neither (an optimizer that
    replaces the data; torch's fused SGD, which keeps no step count), every step stays watched (its optimizer
    hooks say when it updates)."""
    model, _ = _mlp()
    opt: torch.optim.Optimizer = (
        _Replacing(model.parameters())
        if kind == "replacing"
        else torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, fused=True)
    )
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    watched: list[bool] = []
    for _ in range(12):
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, opt, x)
    history = list(tracker.history)
    tracker.close()
    assert all(watched), watched
    assert [s.step for s in history] == list(range(12))


def test_an_optimizer_made_while_steps_rest_is_adopted_at_the_next_look() -> None:
    """The optimizer watch's global hook is out of torch's dict while steps rest: an optimizer the loop makes
    anew without telling the tracker is found at the next look, its states summed from there."""
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=0.02)
    x = torch.randn(8, 16)
    for _ in range(8):
        with tracker.step(samples=8):
            _usual(model, opt, x)
    new = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    began = time.perf_counter()
    while time.perf_counter() - began < 5.0 and tracker._optimizer is not new:
        with tracker.step(samples=8):
            _usual(model, new, x)
    for _ in range(3):
        with tracker.step(samples=8):
            _usual(model, new, x)
    snap = tracker.latest
    tracker.close()
    momentum = sum(p.numel() * p.element_size() for p in model.parameters())
    assert tracker._optimizer is new
    assert snap is not None and snap.memory[Component.OPTIMIZER_STATES] == momentum


def test_a_resting_rows_time_is_the_wall_clocks() -> None:
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    for _ in range(10):
        with tracker.step(samples=8):
            _usual(model, opt, x)
    snap = tracker.latest
    now = time.time()
    tracker.close()
    assert snap is not None and snap.step == 9 and snap.timing.forward_s is not None
    assert now - 2.0 < snap.time <= now


def _events() -> dict[str, Any]:
    from anatomy.hook.guard import Feature

    return {
        "failure": lambda t, m: t._guard.fail(Feature.HEAP, RuntimeError("a heap read failed")),
        "parameter assigned": lambda t, m: setattr(m, "extra", torch.nn.Parameter(torch.zeros(2))),
        "set-up told": lambda t, m: t.set_precision(grad_scaler=True),
        "model added": lambda t, m: t.add_model("teacher", torch.nn.Linear(2, 2)),
        "optimizer added": lambda t, m: t.add_optimizer(torch.optim.SGD(torch.nn.Linear(2, 2).parameters())),
        "framework call": lambda t, m: t.forward_begin(),
    }


@pytest.mark.parametrize("event", list(_events()))
def test_whatever_changes_between_looks_makes_the_next_step_look(event: str) -> None:
    """Steps rest on what the last look saw (the gate): a failure, a parameter assigned on the model, a set-up
    told or added to, a framework's call — each closes it where it happens, and the next step watches its
    forward."""
    model, opt = _mlp()
    tracker = anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600.0)
    x = torch.randn(8, 16)
    watched: list[bool] = []
    for i in range(10):
        if i == 6:
            _events()[event](tracker, model)
        with tracker.step(samples=8):
            watched.append(_watched(model))
            _usual(model, opt, x)
    history = list(tracker.history)
    tracker.close()
    assert not any(watched[3:6]) and watched[6], watched
    assert [s.step for s in history] == list(range(10))
