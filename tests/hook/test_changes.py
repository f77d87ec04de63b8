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
