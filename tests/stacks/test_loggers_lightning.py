"""The anatomy in a Lightning trainer's loggers: real ``fit`` runs with Lightning's CSV logger, whose
metrics.csv is read back."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch

pytestmark = pytest.mark.filterwarnings(
    "ignore::FutureWarning", "ignore::DeprecationWarning", "ignore::UserWarning"
)

BATCH = 4
STEPS = 6
LOG_EVERY = 2
WIDTH = 32


class _Net(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, 1)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.body(x), y)
        self.log("train_loss", loss)  # the user's own metric
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class _Latest(pl.Callback):  # type: ignore[misc]
    """A user's callback after ours: the hook's latest snapshot at the end of each optimizer step."""

    def __init__(self, anatomy_callback: Any) -> None:
        self.anatomy_callback = anatomy_callback
        self.snapshots: dict[int, Any] = {}

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, index: int) -> None:
        tracker = getattr(self.anatomy_callback, "tracker", None)
        if tracker is not None:
            self.snapshots[trainer.global_step] = tracker.latest


def _fit(tmp: Path, callbacks: list[Any], accumulate: int = 1) -> tuple[_Net, list[dict[str, str]]]:
    from lightning.pytorch.loggers import CSVLogger

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, WIDTH, generator=g), torch.randn(64, 1, generator=g)
    data = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH)
    logger = CSVLogger(str(tmp), name="run")
    trainer = pl.Trainer(
        max_steps=STEPS,
        log_every_n_steps=LOG_EVERY,
        accumulate_grad_batches=accumulate,
        logger=logger,
        callbacks=callbacks,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = _Net()
    trainer.fit(model, loader)
    with open(Path(logger.log_dir) / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return model, rows


def _column(rows: list[dict[str, str]], name: str) -> dict[int, float]:
    return {int(r["step"]): float(r[name]) for r in rows if r.get(name) not in (None, "")}


@pytest.mark.parametrize("accumulate", [1, 2])
def test_csv_logger_holds_the_published_anatomy(
    tmp_path: Path, published: list[Any], accumulate: int
) -> None:
    from anatomy.lightning import AnatomyCallback
    from anatomy.vocabulary import Component

    callback = AnatomyCallback(interval_s=0.01)
    latest = _Latest(callback)
    model, rows = _fit(tmp_path, [callback, latest], accumulate)

    losses = _column(rows, "train_loss")
    weights = _column(rows, "anatomy/memory/weights_bytes")
    assert len(losses) == STEPS // LOG_EVERY
    assert set(weights) == set(losses)  # logged at the steps Lightning logs the user's metrics
    # once per logged optimizer step, never for a micro-batch that only accumulates
    assert sum(1 for r in rows if r["anatomy/memory/weights_bytes"]) == len(losses)

    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    own_weights = sum(p.numel() * p.element_size() for p in params)
    for step in sorted(weights):
        # Lightning numbers a step's logs by the optimizer steps before it.
        snap = latest.snapshots[step + 1]
        assert snap is not None and snap.error is None
        assert any(p is snap for p in published)  # the very snapshot the publisher got
        measured = {c: v for c, v in snap.memory.items() if v is not None}
        assert {Component.WEIGHTS.value, Component.GRADIENTS.value, Component.OPTIMIZER_STATES.value} <= set(
            measured
        )
        for component, value in measured.items():  # exact: the CSV keeps the integers
            assert _column(rows, f"anatomy/memory/{component}_bytes")[step] == value, component
        assert snap.peak_bytes is not None
        assert _column(rows, "anatomy/memory/peak_bytes")[step] == snap.peak_bytes
        assert snap.timing.step_s is not None
        assert _column(rows, "anatomy/time/step_s")[step] == snap.timing.step_s
        assert snap.timing.samples_per_s is not None
        assert _column(rows, "anatomy/samples_per_s")[step] == snap.timing.samples_per_s
        # Independent counts: the test's own sums; AdamW: two fp32 moments and a step per parameter.
        assert weights[step] == own_weights
        assert _column(rows, "anatomy/memory/gradients_bytes")[step] == 4 * n
        assert _column(rows, "anatomy/memory/optimizer_states_bytes")[step] == 8 * n + 4 * len(params)
    for component in Component:  # unmeasured is left out, never written as 0
        column = f"anatomy/memory/{component.value}_bytes"
        if all(s is None or s.memory.get(component.value) is None for s in latest.snapshots.values()):
            assert column not in rows[0]


def test_log_false_and_the_users_losses_unchanged(tmp_path: Path) -> None:
    from anatomy.lightning import AnatomyCallback

    _, without = _fit(tmp_path / "without", [])
    quiet = AnatomyCallback(interval_s=0.01, log=False)
    latest = _Latest(quiet)
    _, rows_quiet = _fit(tmp_path / "quiet", [quiet, latest])
    _, rows_with = _fit(tmp_path / "with", [AnatomyCallback(interval_s=0.01)])

    assert not [c for c in rows_quiet[0] if c.startswith("anatomy/")]
    assert any(s is not None for s in latest.snapshots.values())  # measured all the same
    assert [c for c in rows_with[0] if c.startswith("anatomy/")]
    # Bit-identical losses, at the same steps, with and without the callback.
    losses = _column(without, "train_loss")
    assert len(losses) == STEPS // LOG_EVERY
    assert _column(rows_quiet, "train_loss") == losses
    assert _column(rows_with, "train_loss") == losses


def test_a_snapshot_is_made_only_for_the_steps_lightning_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ordinary step's snapshot is made from its row only where one is wanted: at the steps Lightning
    sends to its loggers (one in ``log_every_n_steps``), not at every batch."""
    from anatomy.hook.snapshots import StepSnapshots
    from anatomy.lightning import AnatomyCallback

    asked: list[int] = []
    real = StepSnapshots.latest

    def counting(self: Any) -> Any:
        asked.append(self.steps_done)
        return real.fget(self)  # type: ignore[attr-defined]

    monkeypatch.setattr(StepSnapshots, "latest", property(counting))
    _, rows = _fit(tmp_path, [AnatomyCallback(interval_s=0.01)])
    logged = _column(rows, "anatomy/memory/weights_bytes")
    assert len(logged) == STEPS // LOG_EVERY
    assert len(asked) == len(logged), asked
