"""The Trainer way in: ``Trainer(..., callbacks=[anatomy.AnatomyCallback()])``, guide-shaped runs."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import anatomy
from anatomy import protocol
from anatomy.vocabulary import Component
from tests.stacks.stack_helpers import Collector

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


class _Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """The guide's dummy data: random token ids in 100..30000 and binary labels."""

    def __init__(self, n: int, seq: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(100, 30000, (n, seq), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _trainer(model: torch.nn.Module, tmp: Path, steps: int, callback: Any, **args: Any) -> Any:
    from transformers import Trainer, TrainingArguments

    training_args = TrainingArguments(
        output_dir=str(tmp / "out"),
        per_device_train_batch_size=4,
        max_steps=steps,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **args,
    )
    callbacks = [callback] if callback is not None else None
    return Trainer(model=model, args=training_args, train_dataset=_Tokens(64), callbacks=callbacks)


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_guide_shaped_trainer_run_publishes(hk: SimpleNamespace, tmp_path: Path, runtime_dir: Path) -> None:
    model = hk.small_bert()
    n = sum(p.numel() for p in model.parameters())
    collector = Collector(runtime_dir)
    collector.start()
    callback = anatomy.AnatomyCallback(interval_s=0.01)
    trainer = _trainer(model, tmp_path, 6, callback)
    trainer.train()
    collector.finish()

    assert collector.hello is not None
    hello = collector.hello
    assert hello.pid == os.getpid() and hello.optimizer == "adamw" and hello.optimizer_class == "AdamW"
    assert hello.model_class == "BertForSequenceClassification" and hello.parameter_count == n
    assert hello.precision == "fp32"
    assert len(collector.snapshots) >= 2
    last = collector.snapshots[-1]
    assert last.step >= 3 and last.error is None
    mem = last.memory
    assert mem[Component.GRADIENTS.value] == 4 * n  # measured at on_pre_optimizer_step
    states = mem[Component.OPTIMIZER_STATES.value]
    assert states is not None and states - 4 * len(list(model.parameters())) == 8 * n
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert mem[Component.WEIGHTS.value] == _param_bytes(model) + buffers
    assert mem[Component.ACTIVATIONS.value] and mem[Component.ACTIVATIONS.value] > 0
    assert last.timing.samples_per_s is not None and last.timing.tokens_per_s is not None
    assert last.timing.tokens_per_s == pytest.approx(64 * last.timing.samples_per_s)
    assert last.op_groups is not None
    # train_end closed the tracker: the socket is gone.
    assert callback.tracker is not None and callback.tracker.closed
    assert protocol.discover(runtime_dir) == []


def test_trainer_gradient_accumulation_and_bf16(hk: SimpleNamespace, tmp_path: Path) -> None:
    model = hk.small_bert(vocab=30522)
    n = sum(p.numel() for p in model.parameters())
    callback = anatomy.AnatomyCallback(publish=False, sample_every=0)
    trainer = _trainer(model, tmp_path, 3, callback, gradient_accumulation_steps=2, bf16=True)
    trainer.train()
    tracker = callback.tracker
    assert tracker is not None
    snap = tracker.latest
    assert snap is not None and snap.error is None
    assert snap.grad_accum_steps == 2
    assert tracker.hello.precision == "bf16_mixed"
    assert snap.expected_bytes_per_param[Component.WEIGHTS.value] == 6.0
    weights = snap.memory[Component.WEIGHTS.value]
    assert weights is not None and 4.0 < weights / n <= 6.0  # fp32 master + bf16 copies
    assert snap.memory[Component.GRADIENTS.value] == 4 * n
    # Two micro-batches of 4 per optimizer step.
    assert snap.timing.samples_per_s == pytest.approx(8 / snap.timing.step_s)


@pytest.mark.parametrize("added_later", [False, True])
def test_trainer_oom_writes_file_and_propagates(
    hk: SimpleNamespace, tmp_path: Path, runtime_dir: Path, added_later: bool
) -> None:
    """Given to the Trainer, the callback wraps ``train``; added later (no on_init_end), the
    ``training_step``."""
    model = hk.small_bert()
    calls = {"n": 0}

    def explode_on_third(module: torch.nn.Module, args: object) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    model.bert.register_forward_pre_hook(explode_on_third)
    callback = anatomy.AnatomyCallback(sample_every=0)
    if added_later:
        trainer = _trainer(model, tmp_path, 5, None)
        trainer.add_callback(callback)
    else:
        trainer = _trainer(model, tmp_path, 5, callback)
    with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate 20\.00 GiB"):
        trainer.train()
    hello, snap = protocol.read_oom_file(protocol.oom_path(runtime_dir, os.getpid()))
    assert snap.oom is not None and "Tried to allocate 20.00 GiB" in snap.oom
    assert snap.step == 2 and hello.optimizer == "adamw"
    assert callback.tracker is not None
    if added_later:
        assert "training_step" in vars(trainer) and "train" not in vars(trainer)
        callback.tracker.close()
    assert callback.tracker.closed
    assert protocol.discover(runtime_dir) == []


def test_trainer_disabled_by_environment(
    hk: SimpleNamespace, tmp_path: Path, runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANATOMY_TOP", "0")
    model = hk.small_bert(vocab=30522)
    callback = anatomy.AnatomyCallback()
    trainer = _trainer(model, tmp_path, 2, callback)
    assert "train" not in vars(trainer)  # not wrapped
    trainer.train()
    assert callback.tracker is not None and not callback.tracker.enabled
    assert "training_step" not in vars(trainer) and not callback._tells  # (nothing wrapped, no step told)
    assert not model._forward_pre_hooks
    assert not runtime_dir.exists() or not list(runtime_dir.iterdir())


@pytest.mark.parametrize("record", ["here", False])
def test_trainer_callback_records_where_told(
    hk: SimpleNamespace, tmp_path: Path, runtime_dir: Path, record: str | bool
) -> None:
    """``AnatomyCallback(record=...)`` as ``anatomy.track(record=...)``: a directory gets the run's flight
    record, readable by ``anatomy.runs`` (one row per optimizer update the Trainer counted); False records
    nothing, though recording is on by default (ANATOMY_TOP_RECORD unset)."""
    from anatomy.recorder import default_dir
    from anatomy.runs import list_runs, record_files

    where = tmp_path / "records"
    model = hk.small_bert(vocab=30522)
    callback = anatomy.AnatomyCallback(interval_s=0.01, record=where if record == "here" else False)
    trainer = _trainer(model, tmp_path, 3, callback)
    trainer.train()
    assert callback.tracker is not None and callback.tracker.closed
    assert record_files(default_dir()) == []  # never the default place
    if record is False:
        assert not where.exists() or record_files(where) == []
        return
    (group,) = list_runs(where, snapshots=True)
    (run,) = group.runs
    assert run.pid == os.getpid() and run.model_class == "BertForSequenceClassification"
    assert group.ended == "finished"
    assert [r.step for r in run.rows] == list(range(trainer.state.global_step))
    latest = callback.tracker.latest
    assert latest is not None and run.snapshots[-1] == latest
