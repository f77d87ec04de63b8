"""The Hugging Face Trainer's ordinary steps rest, as README's loop and Lightning's do: the callback begins
each step on its batch (the Trainer's ``training_step``, wrapped), told its samples and tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import anatomy
from anatomy.hook import resting
from tests.stacks.stack_helpers import assert_rested_as_watched, comparable

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

WIDTH = 16
SAMPLES = 16 * 8 - 2  # 16 steps of 8 samples, the last of 6


class _Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Token ids (``input_ids``: integers, a batch with tokens) or floats (``x``), and a target."""

    def __init__(self, kind: str) -> None:
        g = torch.Generator().manual_seed(3)
        self.key = "input_ids" if kind == "tokens" else "x"
        if kind == "tokens":
            self.x = torch.randint(0, 50, (SAMPLES, 6), generator=g)
        else:
            self.x = torch.randn(SAMPLES, 6, generator=g)
        self.y = torch.randn(SAMPLES, 1, generator=g)

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {self.key: self.x[i], "labels": self.y[i]}


class _Model(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        first = torch.nn.Embedding(50, WIDTH) if kind == "tokens" else torch.nn.Linear(1, WIDTH)
        self.body = torch.nn.Sequential(first, torch.nn.Flatten(), torch.nn.Linear(WIDTH * 6, 1))
        self.kind = kind
        self.losses: list[float] = []
        self.watched: list[bool] = []
        self.callback: Any = None

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        x: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        from torch.optim.optimizer import _global_optimizer_pre_hooks

        tracker = self.callback.tracker if self.callback is not None else None
        if tracker is not None:  # (torch's global dict may hold other trackers' hooks, left by other tests)
            ours = tracker._optimizer_watch._handle.id in _global_optimizer_pre_hooks
            self.watched.append(bool(self._forward_pre_hooks) or ours)
        inputs = input_ids if input_ids is not None else x.unsqueeze(-1)  # type: ignore[union-attr]
        loss = torch.nn.functional.mse_loss(self.body(inputs), labels)
        self.losses.append(loss.item())
        return {"loss": loss}


def _args(tmp: Path, **args: Any) -> Any:
    """One epoch of batches of 8, nothing saved or logged."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(tmp / "out"),
        per_device_train_batch_size=8,
        num_train_epochs=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **args,
    )


def _train(model: _Model, callback: Any, tmp: Path, data: Any, **args: Any) -> Any:
    from transformers import Trainer

    model.callback = callback
    callbacks = [callback] if callback is not None else []
    trainer = Trainer(model=model, args=_args(tmp, **args), train_dataset=data, callbacks=callbacks)
    trainer.train()
    return trainer


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("kind", "optim"), [("floats", {}), ("tokens", {}), ("tokens", {"optim": "paged_adamw_8bit"})]
)
def test_ordinary_trainer_steps_rest_under_no_hook_and_publish_what_watched_steps_do(
    published: list[Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    optim: dict[str, str],
    nothing_compiled: None,
) -> None:
    """From the 5th step on, an ordinary step of the last look's batch shape runs its forward with no hook of
    ours on the model and no optimizer hook in torch's global dict; the last batch (6 samples, not 8) is
    watched. Every published snapshot but its times is what the same run publishes with every step watched,
    and the losses are the same — as a run without the callback has them. Under the Trainer's default
    optimizer (torch's fused AdamW) and under bitsandbytes' paged 8-bit AdamW (QLoRA's: its step count a
    Python int)."""
    runs = []
    for rest in (False, True):
        monkeypatch.setattr(resting, "REST_ON", rest)
        published.clear()
        model = _Model(kind)
        callback = anatomy.AnatomyCallback(interval_s=3600.0, sample_every=0, log=False)
        _train(model, callback, tmp_path / str(rest), _Data(kind), **optim)
        runs.append((comparable(published), model.losses, model.watched, published[-2].timing, callback))
    assert_rested_as_watched(*runs)
    plain = _Model(kind)
    _train(plain, None, tmp_path / "plain", _Data(kind), **optim)
    assert plain.losses == runs[1][1]
    timing, callback = runs[1][3:]
    if kind == "tokens":
        assert timing.tokens_per_s == pytest.approx(6 * timing.samples_per_s)
    # a resting step's time split: the last build's, scaled to its step
    assert timing.forward_s and timing.backward_s and timing.optimizer_s and timing.step_s
    assert timing.forward_s + timing.backward_s + timing.optimizer_s <= timing.step_s * (1 + 1e-9)
    assert callback.tracker.closed


def test_accumulating_trainer_steps_are_told_their_batches_and_rest(
    published: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nothing_compiled: None
) -> None:
    """Under gradient accumulation each micro-batch is a block of its step, begun on its batch in
    ``training_step`` and ended at ``on_substep_end`` (the last at ``on_step_end``), told its samples and
    tokens: two micro-batches of 8 a step, the epoch's last 8 and 6. From the 5th step on, a step's
    micro-batches run with no hook of ours (it rests between them); the last step's second micro-batch
    (other samples) is watched. Every snapshot but its times is the same run's with every step watched, and
    the losses are a run's without the callback."""
    runs = []
    for rest in (False, True):
        monkeypatch.setattr(resting, "REST_ON", rest)
        published.clear()
        model = _Model("tokens")
        callback = anatomy.AnatomyCallback(interval_s=3600.0, sample_every=0, log=False)
        trainer = _train(
            model, callback, tmp_path / str(rest), _Data("tokens"), gradient_accumulation_steps=2
        )
        told = [round(s.timing.samples_per_s * s.timing.step_s) for s in published]
        accum = [s.grad_accum_steps for s in published]
        runs.append((comparable(published), model.losses, model.watched, told, accum, callback, trainer))
    (full, full_losses, always, told_full, accum_full), rest_run = runs[0][:5], runs[1]
    rested, losses, watched, told, accum, callback, trainer = rest_run
    assert callback._tells and getattr(trainer.training_step, "_anatomy_tells", None) is callback
    assert all(always) and len(always) == len(watched) == 16
    assert not any(watched[8:15]) and watched[15], watched
    assert told == told_full == [16] * 7 + [14] and accum == accum_full == [2] * 8
    plain = _Model("tokens")
    _train(plain, None, tmp_path / "plain", _Data("tokens"), gradient_accumulation_steps=2)
    assert losses == full_losses == plain.losses
    assert [s["step"] for s in rested] == [s["step"] for s in full] == list(range(8))
    for a, b in zip(rested, full, strict=True):
        assert a == b, a["step"]


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_batch_with_no_key_the_forward_reads_is_watched(
    published: list[Any], tmp_path: Path, accumulate: int
) -> None:
    """A batch the callback cannot read as the model's forward hook does (here under a key of none of
    BATCH_KEYS) is not told: its step (under accumulation, its micro-batch's block) begins as before,
    watched, with the samples the forward hook counts (none here: it reads the same keys)."""

    class Other(_Data):
        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"features": self.x[i], "labels": self.y[i]}

    class OtherModel(_Model):
        def forward(  # type: ignore[override]
            self, features: torch.Tensor | None = None, labels: torch.Tensor | None = None
        ) -> dict[str, torch.Tensor]:
            return super().forward(x=features, labels=labels)

    model = OtherModel("floats")
    callback = anatomy.AnatomyCallback(interval_s=3600.0, sample_every=0, log=False)
    _train(model, callback, tmp_path, Other("floats"), gradient_accumulation_steps=accumulate)
    assert all(model.watched) and len(model.watched) == 16
    # (as the forward hook sees it: keyword arguments of no name it reads, so no samples, as before)
    assert [s.step for s in published] == list(range(16 // accumulate))
    assert all(s.batch_size is None for s in published)
    assert [s.grad_accum_steps for s in published] == [accumulate] * (16 // accumulate)


def test_a_step_whose_training_step_never_runs_begins_late_and_the_next_ones_at_on_step_begin(
    published: list[Any], tmp_path: Path
) -> None:
    """A Trainer whose loop calls something else than its training_step (the callback's events only): the
    step still pending at on_pre_optimizer_step begins there, and from the next step on every step begins
    at on_step_begin again, watched, its samples counted by the forward hook."""
    from transformers import TrainerControl, TrainerState

    model = _Model("floats")
    args = _args(tmp_path)
    callback = anatomy.AnatomyCallback(interval_s=3600.0, sample_every=0, log=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state, control = TrainerState(), TrainerControl()
    callback.on_train_begin(args, state, control, model=model, optimizer=opt)
    callback._tells = True  # (as where the Trainer's training_step is wrapped)
    x, y = torch.randn(8, 6), torch.randn(8, 1)
    for _ in range(3):
        callback.on_step_begin(args, state, control)
        model(x=x, labels=y)["loss"].backward()  # (not through training_step)
        callback.on_pre_optimizer_step(args, state, control)
        opt.step()
        callback.on_optimizer_step(args, state, control)
        opt.zero_grad()
        callback.on_step_end(args, state, control)
    callback.on_train_end(args, state, control)
    assert not callback._tells
    assert [s.step for s in published] == [0, 1, 2]
    assert published[-1].batch_size == 8 and published[-1].timing.forward_s is not None
