"""PyTorch Lightning with ``anatomy.lightning.AnatomyCallback``: automatic and manual optimization,
``accumulate_grad_batches``, two optimizers (a GAN), ``self.model(...)`` inside ``training_step``,
validation not counted, and the Hugging Face callback refused with one clear error. Every published
figure is compared with the training process's own count (its optimizer step post-hooks, its
gradient and optimizer-state sums), and the losses with those of the same fit without the hook."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

import anatomy
from anatomy.hook import resting
from anatomy.hook.schedule import WARMUP_REFRESH_STEPS
from anatomy.vocabulary import Component
from tests.stacks.stack_helpers import assert_rested_as_watched, comparable

BATCHES = 8
WIDTH = 32
SLOW_S = 0.01  # the wall time of a slow module's forward, and again of its backward


class _Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, seed: int = 1) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, WIDTH, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def _loader(n_batches: int, seed: int = 1) -> torch.utils.data.DataLoader:  # type: ignore[type-arg]
    return torch.utils.data.DataLoader(_Data(8 * n_batches, seed), batch_size=8, shuffle=False)


class _SlowIdentity(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        time.sleep(SLOW_S)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        time.sleep(SLOW_S)
        return grad


class _Slow(torch.nn.Module):
    """The identity, with a forward and a backward of SLOW_S each: the model's work outweighs Lightning's
    own between its hooks (a fraction of a millisecond a batch) on any machine, as a real model's does, so
    the phases' sum can be held to the step. No parameters: the counts and losses are the plain net's."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SlowIdentity.apply(x)  # type: ignore[no-any-return]


def _net(seed: int, slow: bool = False) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(WIDTH, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)]
    return torch.nn.Sequential(*layers, *([_Slow()] if slow else []))


class Regressor(pl.LightningModule):
    """Automatic optimization; ``via_submodule``: ``training_step`` calls ``self.model(...)``."""

    def __init__(
        self, via_submodule: bool = False, with_validation: bool = False, slow: bool = False
    ) -> None:
        super().__init__()
        self.model = _net(0, slow)
        self.via_submodule = via_submodule
        self.with_validation = with_validation
        self.losses: list[float] = []
        self.truth: Any = None
        self.validation_batches = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)  # type: ignore[no-any-return]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        out = self.model(x) if self.via_submodule else self(x)
        loss = torch.nn.functional.mse_loss(out, y)
        self.losses.append(loss.item())
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.validation_batches += 1
        torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Gan(pl.LightningModule):
    """Manual optimization with two optimizers, each over its own network."""

    def __init__(self, slow: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = _net(1, slow)
        torch.manual_seed(2)
        self.discriminator = torch.nn.Sequential(
            torch.nn.Linear(1, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1), *([_Slow()] if slow else [])
        )
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        g_opt, d_opt = self.optimizers()
        fake = self.generator(x)
        d_loss = (self.discriminator(fake.detach()) - self.discriminator(y)).pow(2).mean()
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()
        g_loss = self.discriminator(self.generator(x)).pow(2).mean()
        g_opt.zero_grad()
        self.manual_backward(g_loss)
        g_opt.step()
        self.losses += [d_loss.item(), g_loss.item()]

    def configure_optimizers(self) -> Any:
        return (
            torch.optim.AdamW(self.generator.parameters(), lr=1e-3),
            torch.optim.SGD(self.discriminator.parameters(), lr=1e-2, momentum=0.9),
        )


class _TruthCallback(pl.Callback):
    """The test's own count, installed at the fit's start (when the optimizers exist)."""

    def __init__(self, st: SimpleNamespace) -> None:
        self.st = st
        self.truth: Any = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        opts = [getattr(o, "_optimizer", o) for o in trainer.optimizers]
        self.truth = self.st.Truth(pl_module, opts)


def _fit(
    module: Any,
    callbacks: list[Any],
    tmp: Path,
    *,
    val: bool = False,
    batches: int = BATCHES,
    loader: Any = None,
    **kwargs: Any,
) -> Any:
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=str(tmp),
        num_sanity_val_steps=2 if val else 0,
        val_check_interval=4 if val else None,
        limit_val_batches=2 if val else None,
        callbacks=callbacks,
        **kwargs,
    )
    trainer.fit(module, loader or _loader(batches), _loader(2, seed=5) if val else None)
    return trainer


def _run(
    st: SimpleNamespace,
    published: list[Any],
    tmp: Path,
    make: Any,
    *,
    val: bool = False,
    batches: int = BATCHES,
    **kwargs: Any,
) -> tuple[Any, Any, list[Any], list[float]]:
    """The same fit with and without the hook: (module, truth, published snapshots, losses without
    the hook)."""
    from anatomy.lightning import AnatomyCallback

    plain = make()
    _fit(plain, [], tmp / "plain", val=val, batches=batches, **kwargs)
    module = make()
    truth_cb = _TruthCallback(st)
    callback = AnatomyCallback()
    _fit(module, [truth_cb, callback], tmp / "hooked", val=val, batches=batches, **kwargs)
    assert callback.tracker is not None and callback.tracker.closed
    truth_cb.truth.close()
    assert [s.step for s in published] == list(range(len(published)))  # every step, once, in order
    return module, truth_cb.truth, list(published), plain.losses


def _check_phases(st: SimpleNamespace, snaps: list[Any], least: float = 0.95) -> None:
    """Forward, backward and optimizer sum to the step: never over it (5% for the clock's marks) and on the
    median step after the first WARMUP_REFRESH_STEPS within 5% under it. (The first steps re-sum the
    model between the phases — the hook's own work; and a loaded machine can stall any one step between
    two marks: the median is the typical step.)"""
    for snap in snaps[1:]:  # (the first step's clock may still be pending on the first snapshot)
        t = snap.timing
        assert t.forward_s and t.backward_s and t.optimizer_s and t.step_s
        assert st.phases_sum(snap) <= t.step_s * 1.05
    ordinary = [s for s in snaps if s.step >= WARMUP_REFRESH_STEPS]
    assert len(ordinary) >= 3
    assert statistics.median(st.phases_sum(s) / s.timing.step_s for s in ordinary) >= least


def _check_memory(snap: Any, truth: Any, step: int) -> None:
    mem = snap.memory
    assert snap.step == step
    assert mem[Component.GRADIENTS.value] == truth.grads[step]
    assert mem[Component.OPTIMIZER_STATES.value] == truth.states[step]


def test_automatic_optimization(st: SimpleNamespace, published: list[Any], tmp_path: Path) -> None:
    module, truth, snaps, plain_losses = _run(st, published, tmp_path, lambda: Regressor(slow=True))
    assert module.losses == plain_losses  # bit-identical
    assert truth.updates == BATCHES
    assert len(snaps) == BATCHES  # one step per update
    first = snaps[0]
    assert truth.grads[0] > 0
    _check_memory(first, truth, 0)  # gradients read after this step's backward, states after the update
    last = snaps[-1]
    assert last.memory[Component.OPTIMIZER_STATES.value] == truth.states[-1]
    assert last.grad_accum_steps == 1 and last.batch_size == 8
    assert last.memory[Component.ACTIVATIONS.value]
    _check_phases(st, snaps)  # the closure's forward and backward, inside optimizer.step, each once


def test_training_step_calls_a_submodule(st: SimpleNamespace, published: list[Any], tmp_path: Path) -> None:
    module, truth, snaps, plain_losses = _run(st, published, tmp_path, lambda: Regressor(via_submodule=True))
    assert module.losses == plain_losses
    assert snaps and snaps[-1].step == truth.updates - 1 == BATCHES - 1
    _check_memory(next(s for s in snaps if s.step == 0), truth, 0)
    assert snaps[-1].memory[Component.ACTIVATIONS.value]  # the forward is training_step's, whatever it calls
    assert snaps[-1].timing.forward_s


def test_gradient_accumulation(st: SimpleNamespace, published: list[Any], tmp_path: Path) -> None:
    batches = 4 * (WARMUP_REFRESH_STEPS + 3)  # three ordinary steps for the phases' median
    module, truth, snaps, plain_losses = _run(
        st, published, tmp_path, lambda: Regressor(slow=True), batches=batches, accumulate_grad_batches=4
    )
    assert module.losses == plain_losses
    assert truth.updates == batches // 4
    assert snaps[-1].step == truth.updates - 1
    assert all(s.grad_accum_steps == 4 for s in snaps)
    for step in range(truth.updates):
        _check_memory(next(s for s in snaps if s.step == step), truth, step)
    # (the step also holds Lightning's loop and data loading between its four micro-batches, "other" time:
    # 6% of the step on the median one once, on a loaded box)
    _check_phases(st, snaps, least=0.9)


def test_manual_optimization_two_optimizers(
    st: SimpleNamespace, published: list[Any], tmp_path: Path
) -> None:
    module, truth, snaps, plain_losses = _run(st, published, tmp_path, lambda: Gan(slow=True))
    assert module.losses == plain_losses
    assert truth.updates == 2 * BATCHES  # each batch updates both networks: one step
    assert snaps[-1].step == BATCHES - 1
    for snap in snaps:
        mem = snap.memory
        # both optimizers' states, summed (AdamW's two moments, SGD's momentum)
        assert mem[Component.OPTIMIZER_STATES.value] == truth.states[2 * snap.step + 1]
        assert mem[Component.GRADIENTS.value] == max(truth.grads[2 * snap.step : 2 * snap.step + 2])
    # the discriminator's forward, backward and update, then the generator's: each phase sums both
    _check_phases(st, snaps)


def test_validation_is_not_a_step(st: SimpleNamespace, published: list[Any], tmp_path: Path) -> None:
    module, truth, snaps, plain_losses = _run(
        st, published, tmp_path, lambda: Regressor(with_validation=True), val=True
    )
    assert module.losses == plain_losses
    assert module.validation_batches >= 4  # sanity check + two validation runs mid-epoch
    assert truth.updates == BATCHES and snaps[-1].step == BATCHES - 1
    assert all(s.grad_accum_steps == 1 for s in snaps)  # no validation forward joined a step


def test_hugging_face_callback_is_refused_before_training(tmp_path: Path) -> None:
    module = Regressor()
    with pytest.raises(TypeError, match=r"anatomy\.lightning\.AnatomyCallback") as info:
        _fit(module, [anatomy.AnatomyCallback()], tmp_path)
    assert module.losses == []  # not a single training step ran
    assert "Hugging Face" in str(info.value)
    assert info.value.__context__ is None  # one error, not one raised while handling another


def test_imports_stay_light() -> None:
    """``import anatomy`` loads neither torch nor Lightning; ``anatomy.lightning`` loads Lightning only
    when its callback is first used."""
    import subprocess
    import sys

    code = (
        "import sys, anatomy\n"
        "a = [m for m in ('torch', 'lightning', 'pytorch_lightning') if m in sys.modules]\n"
        "import anatomy.lightning\n"
        "b = [m for m in ('lightning', 'pytorch_lightning') if m in sys.modules]\n"
        "cls = anatomy.lightning.AnatomyCallback\n"
        "import lightning.pytorch as pl\n"
        "print(a, b, issubclass(cls, pl.Callback))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[] [] True"


def test_pytorch_lightning_package(tmp_path: Path) -> None:
    """The same callback with the ``pytorch_lightning`` package (in a fresh interpreter, where only that
    Lightning is imported): an instance of its ``Callback``, one step per update, the process's counts, and
    losses bit-identical with those of the same fit without the hook."""
    import subprocess
    import sys

    code = """
import torch, pytorch_lightning as ptl
from anatomy.lightning import AnatomyCallback
updates = []
class M(ptl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
        self.losses = []
    def training_step(self, batch, i):
        loss = self.net(batch[0]).pow(2).mean()
        self.losses.append(loss.item())
        return loss
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        opt.register_step_post_hook(lambda *a: updates.append(
            sum(s["momentum_buffer"].numel() * 4 for s in opt.state.values())))
        return opt
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(48, 4)), batch_size=8)
def fit(callbacks):
    module = M()
    trainer = ptl.Trainer(max_epochs=1, accelerator="cpu", enable_progress_bar=False, logger=False,
                          enable_checkpointing=False, enable_model_summary=False, accumulate_grad_batches=2,
                          callbacks=callbacks)
    trainer.fit(module, data)
    return module.losses
plain = fit([])
del updates[:]
cb = AnatomyCallback()
losses = fit([cb])
seen = list(cb.tracker.history)  # every step of the fit (its last ones: all three)
print(isinstance(cb, ptl.Callback), len(updates), [(s.step, s.grad_accum_steps) for s in seen],
      seen[-1].memory["optimizer_states"] == updates[-1] > 0, losses == plain, len(losses))
"""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "ANATOMY_TOP_DIR": str(tmp_path / "rt"), "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "True 3 [(0, 2), (1, 2), (2, 2)] True True 6"


@pytest.mark.parametrize("record", ["here", False])
def test_the_callback_records_where_told(
    st: SimpleNamespace, published: list[Any], tmp_path: Path, record: str | bool
) -> None:
    """``AnatomyCallback(record=...)`` as ``anatomy.track(record=...)``: a directory gets the fit's flight
    record, readable by ``anatomy.runs`` (one row per optimizer update the process counted); False records
    nothing, though recording is on by default (ANATOMY_TOP_RECORD unset)."""
    from anatomy.lightning import AnatomyCallback
    from anatomy.recorder import default_dir
    from anatomy.runs import list_runs, record_files

    where = tmp_path / "records"
    truth_cb = _TruthCallback(st)
    callback = AnatomyCallback(interval_s=0.01, record=where if record == "here" else False)
    _fit(Regressor(), [truth_cb, callback], tmp_path)
    truth_cb.truth.close()
    assert callback.tracker is not None and callback.tracker.closed
    assert published and record_files(default_dir()) == []  # it published; never the default place
    if record is False:
        assert not where.exists() or record_files(where) == []
        return
    (group,) = list_runs(where, snapshots=True)
    (run,) = group.runs
    assert run.pid == os.getpid() and run.model_class == "Regressor" and group.ended == "finished"
    assert [r.step for r in run.rows] == list(range(truth_cb.truth.updates)) == list(range(BATCHES))
    assert run.snapshots[-1] == published[-1]


def test_ordinary_steps_are_lean_and_publish_what_the_full_way_does(
    published: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Automatic optimization is an ordinary step too (anatomy.hook.framework): after the first steps none
    becomes a record — the batch's forward, the closure, the backward's end and the update all stay on the
    LeanStep — and every published snapshot, but its times, is the one the full way publishes."""
    from anatomy.hook import ordinary
    from anatomy.hook.ordinary import OrdinarySteps
    from anatomy.lightning import AnatomyCallback

    promoted: list[int] = []
    ended_lean: list[int] = []
    real_promote, real_end = OrdinarySteps._promote, OrdinarySteps._end_ordinary

    def promote(self: Any) -> Any:
        promoted.append(self._lean.index)
        return real_promote(self)

    def end(self: Any, index: int, *args: Any) -> bool:
        done = real_end(self, index, *args)
        if done and self._lean.active:
            ended_lean.append(index)
        return done

    monkeypatch.setattr(OrdinarySteps, "_promote", promote)
    monkeypatch.setattr(OrdinarySteps, "_end_ordinary", end)
    runs = []
    for lean in (False, True):
        monkeypatch.setattr(ordinary, "ORDINARY_IN_O1", lean)
        published.clear()
        promoted.clear()
        ended_lean.clear()
        module = Regressor()
        _fit(module, [AnatomyCallback(interval_s=3600.0, sample_every=0)], tmp_path / str(lean), batches=16)
        runs.append((comparable(published), module.losses))
    (full, full_losses), (lean_snaps, lean_losses) = runs
    assert lean_losses == full_losses
    assert [s["step"] for s in lean_snaps] == [s["step"] for s in full] == list(range(16))
    for a, b in zip(lean_snaps, full, strict=True):
        assert a == b, a["step"]
    assert promoted == []  # no Lightning step became a record
    assert len(ended_lean) >= 10, ended_lean  # and most ended lean
    timing = published[-1].timing
    assert timing.forward_s and timing.backward_s and timing.optimizer_s and timing.step_s
    assert timing.forward_s + timing.backward_s + timing.optimizer_s <= timing.step_s


class _Tokens(Regressor):
    """Batches of token ids (integers: a batch that has tokens, which a resting step must be told)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Embedding(50, WIDTH), torch.nn.Flatten(), torch.nn.Linear(WIDTH * 6, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        ids, y = batch
        loss = torch.nn.functional.mse_loss(self(ids), y)
        self.losses.append(loss.item())
        return loss


def _token_loader(samples: int) -> Any:
    g = torch.Generator().manual_seed(3)
    data = torch.utils.data.TensorDataset(
        torch.randint(0, 50, (samples, 6), generator=g), torch.randn(samples, 1, generator=g)
    )
    return torch.utils.data.DataLoader(data, batch_size=8, shuffle=False)


@pytest.mark.parametrize("kind", ["floats", "tokens", "fused"])
def test_ordinary_steps_rest_under_no_hook_and_publish_what_watched_steps_do(
    published: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, nothing_compiled: None
) -> None:
    """The callback tells each step its batch's samples and tokens (Tracker.batch_begins), so an ordinary
    step of the last look's batch shape rests as README's loop does: no forward hook of ours on the module
    and no optimizer hook in torch's global dict while its training_step runs, and none of the callback's
    calls made. Every published snapshot, but its times, is what the same fit publishes with every step
    watched — the last batch too, smaller than the others (its own samples: it is watched)."""
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    from anatomy.lightning import AnatomyCallback

    runs = []
    for rest in (False, True):
        monkeypatch.setattr(resting, "REST_ON", rest)
        published.clear()
        module = _Tokens() if kind == "tokens" else Regressor()
        if kind == "fused":  # (torch's fused AdamW: the update moves no parameter's version counter)
            module.configure_optimizers = lambda module=module: torch.optim.AdamW(  # type: ignore[method-assign]
                module.parameters(), lr=1e-3, fused=True
            )
        watched: list[bool] = []
        step = module.training_step

        callback = AnatomyCallback(interval_s=3600.0, sample_every=0)

        def training_step(
            batch: Any,
            batch_idx: int,
            module: Any = module,
            step: Any = step,
            watched: list[bool] = watched,
            callback: Any = callback,
        ) -> Any:
            # (torch's global dict may hold hooks of other trackers, left by other tests: ours is looked for)
            ours = callback.tracker._optimizer_watch._handle.id in _global_optimizer_pre_hooks
            watched.append(bool(module._forward_pre_hooks) or ours)
            return step(batch, batch_idx)

        module.training_step = training_step  # type: ignore[method-assign]
        samples = 16 * 8 - 2  # (a last batch of 6)
        floats = torch.utils.data.DataLoader(_Data(samples), batch_size=8, shuffle=False)
        loader = _token_loader(samples) if kind == "tokens" else floats
        _fit(module, [callback], tmp_path / str(rest), loader=loader)
        runs.append((comparable(published), module.losses, watched, published[-2].timing))
    assert_rested_as_watched(*runs)
    timing = runs[1][3]
    # a resting step's time split: the last build's, scaled to its step
    assert timing.forward_s and timing.backward_s and timing.optimizer_s and timing.step_s
    assert timing.forward_s + timing.backward_s + timing.optimizer_s <= timing.step_s * (1 + 1e-9)


@pytest.mark.parametrize(
    "call", ["batch_begins", "begin_step", "forward_begin", "backward_begin", "backward_end", "end_step"]
)
def test_a_tracker_call_that_fails_is_said_and_never_stops_the_fit(
    tmp_path: Path, call: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each of the callback's per-batch calls into the tracker under a try of its own: one that raises is
    logged with the Lightning hook it came from, and the fit goes on with the losses it has without us."""
    from anatomy.hook.tracker import Tracker
    from anatomy.lightning import AnatomyCallback

    events = {
        "batch_begins": "on_train_batch_start",
        "begin_step": "on_train_batch_start",
        "forward_begin": "on_train_batch_start",
        "backward_begin": "on_before_backward",
        "backward_end": "on_after_backward",
        "end_step": "on_train_batch_end",
    }
    plain = Regressor()
    _fit(plain, [], tmp_path / "plain")

    def broken(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(Tracker, call, broken)
    monkeypatch.setattr(resting, "REST_ON", False)  # (every batch watched: every call made, each batch)
    module = Regressor()
    callback = AnatomyCallback(publish=False)
    with caplog.at_level("WARNING", logger="anatomy"):
        _fit(module, [callback], tmp_path / "hooked")
    assert module.losses == plain.losses
    said = [r.getMessage() for r in caplog.records if "broken on purpose" in r.getMessage()]
    at_event = [m for m in said if f"the Lightning callback's {events[call]} failed (RuntimeError" in m]
    assert len(at_event) == BATCHES
    # (a step never ended is ended by the next batch's begin_step: that one fails too, where it is called)
    rest = set(said) - set(at_event)
    assert not rest or (call == "end_step" and all("on_train_batch_start failed" in m for m in rest))


def test_accumulating_steps_rest_under_no_hook_and_publish_what_watched_steps_do(
    published: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nothing_compiled: None
) -> None:
    """Under ``accumulate_grad_batches`` each batch is a block of the step its update ends (told its
    samples): an ordinary step of four rests between its blocks as well — no hook of ours while any of its
    batches runs — and every snapshot but its times is the same fit's with every step watched; the last
    step (a batch of 6) is watched."""
    from anatomy.lightning import AnatomyCallback

    runs = []
    for rest in (False, True):
        monkeypatch.setattr(resting, "REST_ON", rest)
        published.clear()
        module = Regressor()
        watched: list[bool] = []
        step = module.training_step

        def training_step(
            batch: Any, batch_idx: int, module: Any = module, step: Any = step, watched: list[bool] = watched
        ) -> Any:
            watched.append(bool(module._forward_pre_hooks))
            return step(batch, batch_idx)

        module.training_step = training_step  # type: ignore[method-assign]
        loader = torch.utils.data.DataLoader(_Data(64 * 8 - 2), batch_size=8, shuffle=False)
        callback = AnatomyCallback(interval_s=3600.0, sample_every=0)
        _fit(module, [callback], tmp_path / str(rest), loader=loader, accumulate_grad_batches=4)
        runs.append((comparable(published), module.losses, watched))
    (full, full_losses, always), (rested, rest_losses, flags) = runs
    assert all(always) and len(always) == len(flags) == 64
    assert not any(flags[4 * 4 : 15 * 4]) and flags[-1], flags  # (from the 5th step; the last watched)
    assert rest_losses == full_losses
    assert [s["step"] for s in rested] == [s["step"] for s in full] == list(range(16))
    for a, b in zip(rested, full, strict=True):
        assert a == b, a["step"]
    assert rested[-2]["grad_accum_steps"] == 4 and rested[-2]["batch_size"] == 8
