"""Issue 16's before/after table: each defect the issue lists, reproduced on a small model with the current
code, printed as the figure the issue quotes ("before", measured then on the issue's own models), what the
hook publishes now, and the training process's own count of the same thing (the tests' oracles:
tests/stacks/stack_helpers.py).

- accelerate, ``tracker.step()`` around each micro-batch (accumulation 4): published steps vs updates,
  ``grad_accum_steps``, optimizer states after 128 micro-batches;
- PyTorch Lightning: the Hugging Face callback's error, steps published for the batches of a fit (also with
  ``self.model(...)`` in ``training_step``), the phases' sum over the step, gradients on step 0 — and a
  two-optimizer GAN's phase sum;
- PEFT LoRA: optimizer-state bytes per trainable parameter vs the guide's 8.00;
- bitsandbytes nf4: weights with the quantization state, the logical parameter count, the format;
- a frozen teacher: its bytes in other_models (not runtime, not unattributed);
- non-reentrant checkpointing on a padded Llama: activations vs what the forward really keeps.

Usage: python benchmarks/stacks_before_after.py   (a minute or two on a 2-core CPU; nothing downloaded)
"""

from __future__ import annotations

import gc
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "stacks"))

import stack_helpers as h  # noqa: E402

import anatomy  # noqa: E402
from anatomy.hook.schedule import WARMUP_REFRESH_STEPS  # noqa: E402
from anatomy.vocabulary import Component  # noqa: E402

Row = tuple[str, str, str, str, str]  # stack, figure, before (the issue), now (the hook), truth
OPT, GRADS, WEIGHTS = Component.OPTIMIZER_STATES.value, Component.GRADIENTS.value, Component.WEIGHTS.value


def _b(n: int | None) -> str:
    return "unmeasured" if n is None else f"{n:,} B"


def _off(now: int | float | None, truth: int | float) -> str:
    """How far the published figure is from the count: exact, or the signed difference in percent."""
    if now is None or not truth:
        return "—"
    if now == truth:
        return "exact"
    off = (now - truth) / truth * 100
    return f"{off:+.2f}%" if abs(off) >= 0.01 or isinstance(now, float) else f"{now - truth:+,} B"


# -- accelerate ----------------------------------------------------------------------------------


def accelerate_rows() -> list[Row]:
    import accelerate
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = accelerate.Accelerator(gradient_accumulation_steps=4, cpu=True)
    model = h.mlp(seed=0, width=256, depth=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    truth = h.Truth(model, [optimizer.optimizer])
    tracker = anatomy.track(model, optimizer, publish=False)
    at_24: tuple[int, int, int] = (0, 0, 0)
    for i, (x, y) in enumerate(h.batches(128, width=256)):
        with tracker.step(samples=len(x)), accelerator.accumulate(model):  # the README's loop shape
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()  # a no-op on non-sync micro-batches
            optimizer.zero_grad()
        if i == 23:
            snap = tracker.latest
            at_24 = (snap.step + 1 if snap else 0, truth.updates, snap.grad_accum_steps if snap else 0)
    snap = tracker.latest
    tracker.close()
    truth.close()
    states = h.state_bytes(optimizer.optimizer)
    now_states = snap.memory[OPT] if snap else None
    return [
        (
            "accelerate (micro)",
            "steps published, 24 micro-batches",
            "24 (for 6 updates)",
            str(at_24[0]),
            f"{at_24[1]} updates",
        ),
        ("accelerate (micro)", "grad_accum_steps", "1", str(at_24[2]), "4"),
        (
            "accelerate (micro)",
            "optimizer states after 128 micro-batches",
            "0 B (truth 4,674,644 B)",
            _b(now_states),
            f"{_b(states)} ({_off(now_states, states)})",
        ),
    ]


# -- Lightning -----------------------------------------------------------------------------------


def _lightning_module(pl: Any, via_submodule: bool) -> Any:
    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = torch.nn.Sequential(
                torch.nn.Linear(32, 512),
                torch.nn.ReLU(),
                torch.nn.Linear(512, 512),
                torch.nn.ReLU(),
                torch.nn.Linear(512, 1),
            )
            self.batches = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            self.batches += 1
            x, y = batch
            return torch.nn.functional.mse_loss(self.model(x) if via_submodule else self(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return Regressor()


def _gan(pl: Any) -> Any:
    class Gan(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            torch.manual_seed(1)
            self.generator = torch.nn.Sequential(
                torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)
            )
            self.discriminator = torch.nn.Sequential(
                torch.nn.Linear(1, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)
            )

        def training_step(self, batch: Any, batch_idx: int) -> None:
            x, y = batch
            g_opt, d_opt = self.optimizers()
            d_loss = (self.discriminator(self.generator(x).detach()) - self.discriminator(y)).pow(2).mean()
            d_opt.zero_grad()
            self.manual_backward(d_loss)
            d_opt.step()
            g_loss = self.discriminator(self.generator(x)).pow(2).mean()
            g_opt.zero_grad()
            self.manual_backward(g_loss)
            g_opt.step()

        def configure_optimizers(self) -> Any:
            return (
                torch.optim.AdamW(self.generator.parameters(), lr=1e-3),
                torch.optim.SGD(self.discriminator.parameters(), lr=1e-2, momentum=0.9),
            )

    return Gan()


def _fit(pl: Any, module: Any, callbacks: list[Any], batches: int) -> None:
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(
        torch.randn(8 * batches, 32, generator=g), torch.randn(8 * batches, 1, generator=g)
    )
    with tempfile.TemporaryDirectory() as tmp:
        trainer = pl.Trainer(
            max_epochs=1,
            accelerator="cpu",
            devices=1,
            enable_progress_bar=False,
            enable_model_summary=False,
            logger=False,
            enable_checkpointing=False,
            default_root_dir=tmp,
            callbacks=callbacks,
        )
        trainer.fit(module, torch.utils.data.DataLoader(data, batch_size=8))


def _tracked_fit(pl: Any, module: Any, batches: int) -> tuple[list[Any], Any]:
    """(the fit's snapshots, the process's own count), with ``anatomy.lightning.AnatomyCallback``."""
    from anatomy.lightning import AnatomyCallback

    class TruthCallback(pl.Callback):
        truth: Any = None

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            opts = [getattr(o, "_optimizer", o) for o in trainer.optimizers]
            TruthCallback.truth = h.Truth(pl_module, opts)

    callback = AnatomyCallback(publish=False)
    _fit(pl, module, [TruthCallback(), callback], batches)
    TruthCallback.truth.close()
    return list(callback.tracker.history), TruthCallback.truth


def _phase_ratio(snaps: list[Any]) -> float:
    """The median ordinary step's (forward + backward + optimizer) / step."""
    return statistics.median(
        h.phases_sum(s) / s.timing.step_s for s in snaps if s.step >= WARMUP_REFRESH_STEPS
    )


def lightning_rows() -> list[Row]:
    import lightning.pytorch as pl

    batches = 16
    refused = _lightning_module(pl, via_submodule=False)
    try:
        _fit(pl, refused, [anatomy.AnatomyCallback()], batches)
        error = "no error"
    except Exception as exc:
        error = f"{type(exc).__name__} naming anatomy.lightning.AnatomyCallback: " + (
            "yes" if "anatomy.lightning.AnatomyCallback" in str(exc) else "no"
        )
    snaps, truth = _tracked_fit(pl, _lightning_module(pl, via_submodule=False), batches)
    sub_snaps, sub_truth = _tracked_fit(pl, _lightning_module(pl, via_submodule=True), batches)
    gan_snaps, _ = _tracked_fit(pl, _gan(pl), batches)
    grads0 = snaps[0].memory[GRADS] if snaps else None
    return [
        (
            "Lightning",
            "pl.Trainer(callbacks=[anatomy.AnatomyCallback()])",
            "AttributeError: no attribute 'setup', mid-fit",
            f"{error}; {refused.batches} batches ran",
            "—",
        ),
        (
            "Lightning",
            f"steps published, {batches} batches",
            "4 for 8 (track() in on_train_start)",
            str(len(snaps)),
            f"{truth.updates} updates",
        ),
        (
            "Lightning",
            "steps published, self.model(...) in training_step",
            "nothing, no warning",
            str(len(sub_snaps)),
            f"{sub_truth.updates} updates",
        ),
        (
            "Lightning",
            "phases / step (median step)",
            "1.4× (track), 1.9× (begin/end_step)",
            f"{_phase_ratio(snaps):.3f}×",
            "1 ± 0.05",
        ),
        (
            "Lightning",
            "gradients, step 0",
            "0 B (begin/end_step)",
            _b(grads0),
            f"{_b(truth.grads[0])} ({_off(grads0, truth.grads[0])})",
        ),
        (
            "Lightning GAN",
            "phases / step (median step), 2 optimizers",
            "0.2–0.5× (found here, fixed)",
            f"{_phase_ratio(gan_snaps):.3f}×",
            "1 ± 0.05",
        ),
    ]


# -- PEFT LoRA -----------------------------------------------------------------------------------


def lora_rows() -> list[Row]:
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer

    from tui.sources.reconcile import reconcile

    model = get_peft_model(
        h.tiny_llama(seed=0), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    callback = anatomy.AnatomyCallback(publish=False)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            model=model, args=h.trainer_args(Path(tmp), 4), train_dataset=h.Tokens(), callbacks=[callback]
        )
        trainer.train()
    tracker = callback.tracker
    hello, snap = tracker.hello, tracker.history[-1]
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    row = next(r for r in reconcile(hello, snap, None).rows if r.component == Component.OPTIMIZER_STATES)
    opt_bytes = h.optimizer_state_bytes(trainer.optimizer)
    truth = opt_bytes / trainable
    return [
        (
            "PEFT LoRA",
            "parameters (trainable)",
            "592.5k, no trainable count",
            f"{hello.parameter_count:,} ({hello.trainable_parameter_count:,})",
            f"{total:,} ({trainable:,})",
        ),
        (
            "PEFT LoRA",
            "optimizer states, B per parameter (guide)",
            f"0.11 (guide 8.00); ÷ all {opt_bytes / total:.2f} here",
            f"{row.bytes_per_param:.2f} (guide {row.expected_bytes_per_param:.2f})",
            f"{truth:.2f} ({_off(row.bytes_per_param, truth)})",
        ),
    ]


# -- bitsandbytes 4-bit --------------------------------------------------------------------------


def nf4_rows() -> list[Row]:
    model = h.QuantizedNet("nf4")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 128, generator=g), torch.randint(0, 8, (16,), generator=g)
    tracker = anatomy.track(model, opt, publish=False)
    for _ in range(3):
        with tracker.step():
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    hello, snap = tracker.hello, tracker.history[-1]
    tracker.close()
    logical, weights, state = h.quantized_counts(model)
    packed = sum(p.numel() for p in model.parameters())
    return [
        (
            "bitsandbytes nf4",
            "weights incl. quantization state",
            f"−1.9% (state missed); −{state / weights * 100:.1f}% here",
            _b(snap.memory[WEIGHTS]),
            f"{_b(weights)} ({_off(snap.memory[WEIGHTS], weights)})",
        ),
        (
            "bitsandbytes nf4",
            "parameter count (logical)",
            f"331,786 packed vs 593,930 (−44%); {packed:,} packed here",
            f"{hello.parameter_count:,}",
            f"{logical:,} ({_off(hello.parameter_count, logical)})",
        ),
        (
            "bitsandbytes nf4",
            "weight_quantization (precision)",
            "none (fp32)",
            f"{hello.weight_quantization} ({hello.precision})",
            "nf4 (fp32 adapters)",
        ),
    ]


# -- a teacher -----------------------------------------------------------------------------------


def _teacher() -> torch.nn.Module:
    torch.manual_seed(1)
    return (
        torch.nn.Sequential(
            torch.nn.Linear(64, 2048),
            torch.nn.ReLU(),
            torch.nn.Linear(2048, 2048),
            torch.nn.ReLU(),
            torch.nn.Linear(2048, 10),
        )
        .eval()
        .requires_grad_(False)
    )


def _distill(teacher_at: Callable[[int, Any], torch.nn.Module | None], named: bool) -> list[Any]:
    """Four distillation steps; ``teacher_at(step, tracker)`` gives the teacher in use from that step."""
    torch.manual_seed(0)
    student = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    teacher = teacher_at(-1, None)
    others = {"teacher": teacher} if named and teacher is not None else None
    tracker = anatomy.track(student, opt, publish=False, others=others)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
    snaps = []
    for step in range(4):
        arrived = teacher_at(step, tracker)
        teacher = arrived if arrived is not None else teacher
        with tracker.step():
            logits = student(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            if teacher is not None:
                with torch.no_grad():
                    soft = teacher(x).softmax(-1)
                loss = loss + torch.nn.functional.kl_div(logits.log_softmax(-1), soft, reduction="batchmean")
            loss.backward()
            opt.step()
            opt.zero_grad()
        snaps.append(tracker.latest)
    tracker.close()
    return snaps


def teacher_rows() -> list[Row]:
    early = _teacher()
    expected = h.module_bytes(early)
    gc.collect()
    named = _distill(lambda step, tracker: early if step < 0 else None, named=True)[-1]
    gc.collect()
    unnamed = _distill(lambda step, tracker: early if step < 0 else None, named=False)[-1]
    moved = (unnamed.memory[Component.RUNTIME.value] or 0) - (named.memory[Component.RUNTIME.value] or 0)

    def late(step: int, tracker: Any) -> torch.nn.Module | None:
        if step != 2:
            return None
        made.append(_teacher())
        tracker.add_model("teacher", made[-1])
        return made[-1]

    made: list[torch.nn.Module] = []
    gc.collect()
    snaps = _distill(late, named=False)
    before, after = snaps[1].at_peak or {}, snaps[-1].at_peak or {}
    grew = (after.get(Component.UNATTRIBUTED.value) or 0) - (before.get(Component.UNATTRIBUTED.value) or 0)
    other_early = named.memory[Component.OTHER_MODELS.value]
    other_late = after.get(Component.OTHER_MODELS.value)
    late_truth = h.module_bytes(made[-1])
    return [
        (
            "teacher (others=)",
            "teacher built before step 1",
            "44 MiB in Runtime",
            f"other_models {_b(other_early)}; Runtime {moved / 2**20:.1f} MiB below the unnamed run's",
            f"{_b(expected)} = {expected / 2**20:.1f} MiB ({_off(other_early, expected)})",
        ),
        (
            "teacher (add_model)",
            "teacher built at step 2",
            "in Unattributed",
            f"other_models {_b(other_late)} at the peak; Unattributed {grew / 2**20:+.2f} MiB",
            f"{_b(late_truth)} ({_off(other_late, late_truth)})",
        ),
    ]


# -- checkpointing -------------------------------------------------------------------------------


def checkpoint_rows() -> list[Row]:
    batch = h.padded_batch(batch=8, seq=128)

    def model() -> torch.nn.Module:
        m = h.tiny_llama(seed=0)
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return m.train()

    oracle = model()
    kept = h.forward_keeps(lambda: oracle(**batch).loss)
    trained = model()
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-3)
    tracker = anatomy.track(trained, opt, publish=False)
    for _ in range(3):
        with tracker.step():
            trained(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
    acts = tracker.latest.memory[Component.ACTIVATIONS.value] if tracker.latest else None
    tracker.close()
    return [
        (
            "checkpointing",
            "activations, padded Llama 8×128, non-reentrant",
            "−3.0% (−1.4% unpadded)",
            _b(acts),
            f"{_b(kept)} forward keeps ({_off(acts, kept)})",
        ),
    ]


# -- the table -----------------------------------------------------------------------------------


@contextmanager
def _quiet() -> Iterator[None]:
    import logging

    logging.disable(logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    logging.disable(logging.NOTSET)


def main() -> None:
    import os

    rows: list[Row] = []
    # (the Trainer prints its logs: off the table's stdout)
    with tempfile.TemporaryDirectory() as runtime, _quiet(), redirect_stdout(sys.stderr):
        os.environ["ANATOMY_TOP_DIR"] = runtime  # (nothing is published; no record lands in the user's)
        os.environ["ANATOMY_TOP_RECORD"] = "0"
        for part in (accelerate_rows, lightning_rows, lora_rows, nf4_rows, teacher_rows, checkpoint_rows):
            rows += part()
            print(f"  ({part.__name__} done)", file=sys.stderr, flush=True)
    header = ("stack", "figure", "before (issue 16)", "now (published)", "truth (the process's count)")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
