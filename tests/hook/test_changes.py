"""A model or optimizer that changes mid-run: noticed at the next step, every sum re-taken there, the
new hello published at once, and nothing of the user's kept alive by the tracker."""

from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import torch

import anatomy
from anatomy import protocol
from anatomy.vocabulary import Component


def _storage_sum(tensors: object) -> int:
    seen: dict[int, int] = {}
    for t in tensors:  # type: ignore[attr-defined]
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _states(opt: torch.optim.Optimizer) -> int:
    return _storage_sum(t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor))


def _lm_batch(vocab: int = 5000) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def _steps(model: torch.nn.Module, opt: torch.optim.Optimizer, tracker: anatomy.Tracker, n: int) -> None:
    batch = _lm_batch()
    for _ in range(n):
        with tracker.step():
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # gradients stay: their sum is checked after the step


class _Hellos:
    """A real reader on the tracker's socket, collecting every hello it receives."""

    def __init__(self, path: Path) -> None:
        self.reader = protocol.Reader(path)
        self.reader.wait()
        self.seen: list[protocol.Hello] = []

    def wait_for(self, predicate: object, timeout: float = 5.0) -> protocol.Hello:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.reader.poll()
            hello = self.reader.hello
            if hello is not None and (not self.seen or self.seen[-1] is not hello):
                self.seen.append(hello)
            if hello is not None and predicate(hello):  # type: ignore[operator]
                return hello
            time.sleep(0.02)
        raise AssertionError(f"no such hello; saw {self.seen}")


def test_untied_head_and_recreated_optimizer_are_measured_at_the_next_step(hk: SimpleNamespace) -> None:
    model = hk.small_gpt2()  # lm_head tied to the token embedding
    opt = torch.optim.AdamW(model.parameters())
    n_tied = sum(p.numel() for p in model.parameters())
    tracker = anatomy.track(model, opt, interval_s=0.01, sample_every=100)
    _steps(model, opt, tracker, 4)
    assert tracker.socket_path is not None
    hellos = _Hellos(tracker.socket_path)
    assert hellos.wait_for(lambda h: h.parameter_count == n_tied)
    # Untie the head and re-create the optimizer, without telling the tracker.
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    old = weakref.ref(opt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    _steps(model, opt, tracker, 1)  # step 4: not a scheduled refresh step
    snap = tracker.latest
    assert snap is not None and snap.step == 4 and snap.error is None
    params = list(model.parameters())
    assert snap.memory[Component.WEIGHTS.value] == _storage_sum([*params, *model.buffers()])
    assert snap.memory[Component.GRADIENTS.value] == _storage_sum(p.grad for p in params)
    assert snap.memory[Component.OPTIMIZER_STATES.value] == _states(opt) > 0  # the new optimizer's
    hello = hellos.wait_for(lambda h: h.parameter_count > n_tied)
    assert hello.parameter_count == sum(p.numel() for p in params)
    gc.collect()
    assert old() is None  # the replaced optimizer (and its states) died with the user's reference
    hellos.reader.close()
    tracker.close()


def test_model_cast_to_bf16_publishes_a_new_hello(hk: SimpleNamespace) -> None:
    model = hk.small_gpt2()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tracker = anatomy.track(model, opt, interval_s=0.01, sample_every=100)
    _steps(model, opt, tracker, 4)
    assert tracker.socket_path is not None
    hellos = _Hellos(tracker.socket_path)
    assert hellos.wait_for(lambda h: h.dtype == "float32" and h.precision == "fp32")
    model.to(torch.bfloat16)
    _steps(model, opt, tracker, 1)
    snap = tracker.latest
    assert snap is not None
    assert snap.memory[Component.WEIGHTS.value] == _storage_sum([*model.parameters(), *model.buffers()])
    hello = hellos.wait_for(lambda h: h.dtype == "bfloat16")
    assert hello.precision == "bf16"
    hellos.reader.close()
    tracker.close()


def test_the_tracker_keeps_no_user_object_alive(hk: SimpleNamespace) -> None:
    """A replaced head and a replaced optimizer die with the user's last reference to them."""
    model = hk.small_bert(vocab=2000)
    opt = torch.optim.AdamW(model.parameters())
    batch = hk.bert_batch()
    batch["input_ids"] = batch["input_ids"] % 2000
    tracker = anatomy.track(model, opt, publish=False, sample_every=2)
    hk.train_steps(model, opt, 3, tracker, batch=batch)
    old_head, old_opt = weakref.ref(model.classifier.weight), weakref.ref(opt)
    model.classifier = torch.nn.Linear(model.classifier.in_features, 2)
    opt = torch.optim.AdamW(model.parameters())
    hk.train_steps(model, opt, 2, tracker, batch=batch)
    gc.collect()
    assert old_head() is None and old_opt() is None
    snap = tracker.latest
    assert snap is not None and snap.memory[Component.OPTIMIZER_STATES.value] == _states(opt)
    tracker.close()


class _Sliced(torch.nn.Module):
    """Slices its layer list into a new ModuleList in every forward, as Hugging Face models do: one module
    registration per layer per step."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(depth))
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[: len(self.layers)]:
            x = torch.relu(layer(x))
        return self.head(x)


def test_modules_registered_inside_the_forward_cost_no_call_per_layer_and_changes_are_still_seen() -> None:
    """The registration watch rests while the model's forward runs: a model that builds a ModuleList of its
    layers in every forward costs it no call per layer (none at all in a step, whatever the depth). A head
    assigned between steps is still measured at the next one."""
    import sys

    torch.manual_seed(0)
    model = _Sliced(depth=24)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = anatomy.track(model, opt, publish=False, interval_s=3600.0, sample_every=0)
    x = torch.randn(4, 8)

    def steps(n: int) -> None:
        for _ in range(n):
            with tracker.step():
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()

    steps(8)
    registered = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal registered
        code = frame.f_code  # type: ignore[attr-defined]
        if event == "call" and code.co_name == "_registered" and code.co_filename.endswith("changes.py"):
            registered += 1

    sys.setprofile(profile)
    try:
        steps(3)
    finally:
        sys.setprofile(None)
    assert registered == 0
    model.head = torch.nn.Linear(8, 1, bias=False)  # between steps: seen at the next one
    steps(1)
    snap = tracker.latest
    tracker.close()
    expected = _storage_sum([*model.parameters()])
    assert snap is not None and snap.memory[Component.WEIGHTS] == expected


def test_one_hook_of_ours_begins_each_optimizer_step_and_a_new_optimizer_is_timed_from_its_first() -> None:
    """The tracked optimizer's step pre-hook is torch's global one (the watch for new optimizers), not a
    second hook of its own; an optimizer made without telling the tracker is adopted at its first step and
    that very step's optimizer phase is timed; the user's own pre-hooks still run, after ours."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters())
    tracker = anatomy.track(model, opt, publish=False, sample_every=0)
    seen: list[str] = []

    def users(optimizer: object, args: object, kwargs: object) -> None:
        seen.append("user's")

    opt.register_step_pre_hook(users)
    assert len(opt._optimizer_step_pre_hooks) == 1  # the user's only
    assert len(opt._optimizer_step_post_hooks) == 1  # ours: the update's end
    x = torch.randn(4, 8)

    def steps(optimizer: torch.optim.Optimizer, n: int) -> None:
        for _ in range(n):
            with tracker.step():
                model(x).sum().backward()
                optimizer.step()
                optimizer.zero_grad()

    steps(opt, 4)
    assert seen == ["user's"] * 4
    timed = [s.timing.optimizer_s for s in tracker.history]
    assert len(timed) == 4 and all(t is not None and t > 0 for t in timed)
    again = torch.optim.SGD(model.parameters(), lr=0.1)  # not told to the tracker
    steps(again, 1)
    snap = tracker.latest
    assert snap is not None and snap.step == 4
    assert snap.timing.optimizer_s is not None and snap.timing.optimizer_s > 0  # adopted at its first step
    assert not again._optimizer_step_pre_hooks and len(again._optimizer_step_post_hooks) == 1
    assert not opt._optimizer_step_post_hooks  # the replaced one's hook removed
    steps(again, 3)
    assert [s.step for s in tracker.history][-4:] == [4, 5, 6, 7]
    assert all(s.timing.optimizer_s is not None for s in tracker.history[-4:])
    tracker.close()
