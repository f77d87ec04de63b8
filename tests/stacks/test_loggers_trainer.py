"""The anatomy in the Hugging Face Trainer's own logs: real Trainer runs with ``report_to=["tensorboard"]``
whose event files are read back with TensorBoard's own reader."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

BATCH = 4
SEQ = 16
STEPS = 6
LOGGING_STEPS = 2
# Keys of the Trainer's logs that measure wall time: they differ between any two runs.
_WALL_CLOCK = ("train_runtime", "train_samples_per_second", "train_steps_per_second")


@pytest.fixture(autouse=True)
def _event_file_under_output_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    # (the runtime directory is the stack tests' conftest's, one per test)
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)


class _Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(5, 1000, (n, SEQ), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _bert() -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    return BertForSequenceClassification(cfg)


class _Seen:
    """A user's callback: what its ``on_log`` receives, and the hook's latest snapshot at that moment."""

    def __init__(self, anatomy_callback: Any = None) -> None:
        from transformers import TrainerCallback

        seen = self

        class Callback(TrainerCallback):
            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
                seen.logs.append((state.global_step, dict(logs)))
                tracker = getattr(anatomy_callback, "tracker", None)
                if tracker is not None and "loss" in logs:
                    seen.snapshots[state.global_step] = tracker.latest

        self.callback = Callback()
        self.logs: list[tuple[int, dict[str, Any]]] = []
        self.snapshots: dict[int, Any] = {}


def _train(
    tmp: Path, callbacks: list[Any], trainer_class: Any = None, added_later: Any = None, **args: Any
) -> Any:
    from transformers import Trainer, TrainingArguments

    training_args = TrainingArguments(
        output_dir=str(tmp),
        per_device_train_batch_size=BATCH,
        max_steps=STEPS,
        report_to=["tensorboard"],
        logging_steps=LOGGING_STEPS,
        use_cpu=True,
        save_strategy="no",
        dataloader_num_workers=0,
        **args,
    )
    cls = trainer_class or Trainer
    trainer = cls(model=_bert(), args=training_args, train_dataset=_Tokens(), callbacks=callbacks)
    if added_later is not None:  # after the Trainer's __init__: the callback never sees on_init_end
        trainer.add_callback(added_later)
    trainer.train()
    return trainer


def _events(tmp: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(tmp.glob("runs/*/events.out.tfevents.*"))
    assert len(files) == 1, files
    acc = EventAccumulator(str(files[0]))
    acc.Reload()
    return acc


def _scalars(acc: Any, tag: str) -> dict[int, float]:
    return {e.step: e.value for e in acc.Scalars(tag)}


def _f32(value: float) -> float:
    """What TensorBoard keeps of a scalar (a float32)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


@pytest.mark.parametrize(("accumulate", "later"), [(1, False), (2, True)])
def test_tensorboard_holds_the_published_anatomy(
    tmp_path: Path, published: list[Any], accumulate: int, later: bool
) -> None:
    import anatomy
    from anatomy.vocabulary import Component

    callback = anatomy.AnatomyCallback(interval_s=0.01)
    seen = _Seen(callback)
    trainer = _train(
        tmp_path,
        [seen.callback] if later else [callback, seen.callback],
        added_later=callback if later else None,
        gradient_accumulation_steps=accumulate,
    )
    acc = _events(tmp_path)
    tags = set(acc.Tags()["scalars"])
    logged_steps = sorted(_scalars(acc, "train/loss"))
    assert logged_steps == list(range(LOGGING_STEPS, STEPS + 1, LOGGING_STEPS))
    assert sorted(seen.snapshots) == logged_steps

    model = trainer.model
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    own_weights = sum(p.numel() * p.element_size() for p in params) + sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    weights = _scalars(acc, "train/anatomy/memory/weights_bytes")
    assert set(weights) == set(logged_steps)
    for step in logged_steps:
        snap = seen.snapshots[step]
        assert snap is not None and snap.error is None
        assert any(p is snap for p in published)  # the very snapshot the publisher got
        # Every component the hook measured, under its vocabulary name, at the logging step.
        measured = {c: v for c, v in snap.memory.items() if v is not None}
        named = (Component.WEIGHTS, Component.GRADIENTS, Component.ACTIVATIONS)
        assert {c.value for c in named} <= set(measured)
        for component, value in measured.items():
            tag = f"train/anatomy/memory/{component}_bytes"
            assert _scalars(acc, tag)[step] == _f32(value), tag
        for component, value in snap.memory.items():
            if value is None:  # unmeasured is left out, never logged as 0
                assert f"train/anatomy/memory/{component}_bytes" not in tags
        assert snap.peak_bytes is not None
        assert _scalars(acc, "train/anatomy/memory/peak_bytes")[step] == _f32(snap.peak_bytes)
        timing = snap.timing
        for phase in ("step", "forward", "backward", "optimizer"):
            value = getattr(timing, f"{phase}_s")
            assert value is not None and value > 0
            assert _scalars(acc, f"train/anatomy/time/{phase}_s")[step] == _f32(value)
        assert timing.forward_s + timing.backward_s + timing.optimizer_s <= timing.step_s * 1.0001
        assert _scalars(acc, "train/anatomy/samples_per_s")[step] == _f32(timing.samples_per_s)
        assert _scalars(acc, "train/anatomy/tokens_per_s")[step] == _f32(timing.tokens_per_s)
        # Independent counts: the test's own sums over the model, AdamW's two fp32 moments + a step each.
        assert weights[step] == _f32(own_weights)
        assert _scalars(acc, "train/anatomy/memory/gradients_bytes")[step] == _f32(4 * n)
        states = _scalars(acc, "train/anatomy/memory/optimizer_states_bytes")[step]
        assert states == _f32(8 * n + 4 * len(params))
        assert _scalars(acc, "train/anatomy/memory/peak_bytes")[step] > own_weights + 4 * n + 8 * n
        tokens = _scalars(acc, "train/anatomy/tokens_per_s")[step]
        assert tokens == pytest.approx(SEQ * _scalars(acc, "train/anatomy/samples_per_s")[step], rel=1e-6)
    if any(s.mfu is not None for s in seen.snapshots.values()):  # CUDA with a known peak only
        assert "train/anatomy/mfu" in tags
    # The user's callback, after the reporting integrations, sees the same keys they logged.
    for step, logs in seen.logs:
        if "loss" in logs:
            assert logs["anatomy/memory/weights_bytes"] == weights[step]
    # Evaluation-style and summary logs are left alone: only periodic training logs carry the anatomy.
    summary = [logs for _, logs in seen.logs if "train_runtime" in logs]
    assert len(summary) == 1 and not any(k.startswith("anatomy/") for k in summary[0])


def test_log_false_writes_no_anatomy(tmp_path: Path) -> None:
    import anatomy

    callback = anatomy.AnatomyCallback(interval_s=0.01, log=False)
    seen = _Seen(callback)
    trainer = _train(tmp_path, [callback, seen.callback])
    acc = _events(tmp_path)
    tags = acc.Tags()["scalars"]
    assert "train/loss" in tags
    assert not [t for t in tags if "anatomy" in t]
    assert len(seen.snapshots) == STEPS // LOGGING_STEPS  # the hook measured all the same
    assert not any(k.startswith("anatomy/") for _, logs in seen.logs for k in logs)
    assert [type(cb).__name__ for cb in trainer.callback_handler.callbacks].count("LogInjector") == 0


def test_the_users_logs_and_losses_are_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without and with the callback: the same logs (bit-identical losses), the user's key of an anatomy name
    kept, log_history untouched, and nothing added to the console (PrinterCallback with disable_tqdm)."""
    from transformers import Trainer

    import anatomy

    class UserTrainer(Trainer):
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            if "loss" in logs:
                logs["anatomy/samples_per_s"] = 123.0  # a user's own key of an anatomy name
                logs["user/metric"] = 7.0
            super().log(logs, start_time)

    runs: dict[str, tuple[Any, _Seen, str]] = {}
    for name, callback in (("without", None), ("with", anatomy.AnatomyCallback(interval_s=0.01))):
        seen = _Seen(callback)
        callbacks = [seen.callback] if callback is None else [callback, seen.callback]
        trainer = _train(tmp_path / name, callbacks, trainer_class=UserTrainer, disable_tqdm=True)
        runs[name] = (trainer, seen, capsys.readouterr().out)

    without, with_ = runs["without"], runs["with"]
    assert len(without[1].logs) == len(with_[1].logs) == STEPS // LOGGING_STEPS + 1
    for (step_a, logs_a), (step_b, logs_b) in zip(without[1].logs, with_[1].logs, strict=True):
        assert step_a == step_b
        for key, value in logs_a.items():
            if key not in _WALL_CLOCK:
                assert logs_b[key] == value, key  # exact: the same floats
        added = set(logs_b) - set(logs_a)
        assert all(k.startswith("anatomy/") for k in added)
        assert bool(added) == ("loss" in logs_a)
    losses = [logs["loss"] for _, logs in with_[1].logs if "loss" in logs]
    assert losses == [logs["loss"] for _, logs in without[1].logs if "loss" in logs]

    def history(trainer: Any) -> list[dict[str, Any]]:
        return [{k: v for k, v in h.items() if k not in _WALL_CLOCK} for h in trainer.state.log_history]

    assert history(with_[0]) == history(without[0])  # trainer_state.json's log history: as without us

    acc_a, acc_b = _events(tmp_path / "without"), _events(tmp_path / "with")
    assert _scalars(acc_b, "train/loss") == _scalars(acc_a, "train/loss")
    assert _scalars(acc_b, "train/user/metric") == _scalars(acc_a, "train/user/metric")
    assert set(_scalars(acc_b, "train/anatomy/samples_per_s").values()) == {123.0}  # theirs, not ours
    assert "train/anatomy/memory/weights_bytes" in acc_b.Tags()["scalars"]

    out_a, out_b = without[2], with_[2]
    assert out_a.count("'loss'") == out_b.count("'loss'") == STEPS // LOGGING_STEPS
    assert "anatomy/memory" not in out_b  # the console prints the user's logs only


# -- the pieces, without a training run --------------------------------------------------------------


def _snapshot(**fields: Any) -> Any:
    from anatomy.protocol import Snapshot

    base: dict[str, Any] = {
        "pid": 1,
        "seq": 1,
        "time": 0.0,
        "step": 0,
        "memory": {},
        "expected_bytes_per_param": {},
        "parameter_count": 10,
    }
    return Snapshot(**{**base, **fields})


def test_every_component_of_the_vocabulary_is_named_and_unmeasured_is_left_out() -> None:
    from anatomy.log_metrics import snapshot_metrics
    from anatomy.protocol import Timing
    from anatomy.vocabulary import Component

    memory = {c.value: 1000 + i for i, c in enumerate(Component)}
    metrics = snapshot_metrics(
        _snapshot(memory=memory, peak_bytes=5, timing=Timing(step_s=0.5, samples_per_s=8.0), mfu=0.25)
    )
    for component, value in memory.items():
        assert metrics[f"anatomy/memory/{component}_bytes"] == value
    assert metrics["anatomy/memory/peak_bytes"] == 5
    assert metrics["anatomy/time/step_s"] == 0.5 and metrics["anatomy/samples_per_s"] == 8.0
    assert metrics["anatomy/mfu"] == 0.25
    # None is "unmeasured": absent, never 0 (forward_s, tokens_per_s, tflops here).
    assert "anatomy/time/forward_s" not in metrics and "anatomy/tokens_per_s" not in metrics
    assert "anatomy/tflops" not in metrics
    memory = {Component.WEIGHTS.value: 3, Component.GRADIENTS.value: None}
    partial = snapshot_metrics(_snapshot(memory=memory))
    assert partial == {"anatomy/memory/weights_bytes": 3}
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in metrics.values())


def test_log_metrics_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, anatomy.log_metrics; print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _handler(*callbacks: Any) -> Any:
    from transformers import DefaultFlowCallback, PrinterCallback
    from transformers.trainer_callback import CallbackHandler

    return CallbackHandler([DefaultFlowCallback(), *callbacks, PrinterCallback()], None, None, None, None)


def _events_counter() -> Any:
    from transformers import TrainerCallback

    class Counter(TrainerCallback):
        def __init__(self) -> None:
            self.begins = 0
            self.logs: list[dict[str, Any]] = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.begins += 1

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            self.logs.append(dict(logs))

    return Counter()


def test_installing_from_inside_an_event_delivers_no_event_twice(capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    from anatomy.hook import trainer_logs
    from anatomy.vocabulary import Component

    snap = _snapshot(memory={Component.WEIGHTS.value: 42})
    before, after = _events_counter(), _events_counter()

    class Owner(TrainerCallback):  # stands for AnatomyCallback: installs at on_train_begin, as it does
        def __init__(self) -> None:
            self.begins = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.begins += 1
            trainer_logs.install(handler, self, lambda: snap)

    owner = Owner()
    handler = _handler(before, owner, after)
    args = TrainingArguments(output_dir="unused", report_to="none")
    state, control = TrainerState(), TrainerControl()
    for _ in range(2):  # two train() calls: one injector, one stripper
        handler.on_train_begin(args, state, control)
    assert (before.begins, owner.begins, after.begins) == (2, 2, 2)
    names = [type(cb).__name__ for cb in handler.callbacks]
    assert names == [
        "LogInjector", "DefaultFlowCallback", "Counter", "Owner", "Counter", "LogStripper", "PrinterCallback"
    ]

    handler.on_log(args, state, control, logs={"loss": 1.5})
    handler.on_log(args, state, control, logs={"eval_loss": 2.5})  # not a training log: untouched
    assert before.logs == [{"loss": 1.5, "anatomy/memory/weights_bytes": 42}, {"eval_loss": 2.5}]
    assert after.logs == before.logs
    printed = capsys.readouterr().out
    assert "'loss'" in printed and "anatomy" not in printed

    handler.remove_callback(owner)  # the user took the AnatomyCallback out: nothing is added any more
    handler.on_log(args, state, control, logs={"loss": 1.0})
    assert before.logs[-1] == {"loss": 1.0}


def test_a_failing_snapshot_never_reaches_the_trainer(caplog: pytest.LogCaptureFixture) -> None:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

    from anatomy.hook import trainer_logs

    def broken() -> Any:
        raise RuntimeError("boom")

    owner = TrainerCallback()
    handler = _handler(owner)
    trainer_logs.install(handler, owner, broken)
    logs = {"loss": 0.5, "grad_norm": 1.0}
    args = TrainingArguments(output_dir="unused", report_to="none")
    handler.on_log(args, TrainerState(), TrainerControl(), logs=logs)
    assert logs == {"loss": 0.5, "grad_norm": 1.0}
    assert "boom" in caplog.text
