"""Distillation: a frozen teacher runs in every step. Its weights are the ``other_models`` component —
named in the hello with its bytes — never runtime (a teacher built before the first step) nor
unattributed (one built later). Against the test's own count of the teacher's parameters and buffers;
the training is bit-identical with and without the hook.
"""

from __future__ import annotations

import gc

import pytest
import torch
from stack_helpers import module_bytes  # (this directory is on sys.path: its conftest)

import anatomy
from anatomy.vocabulary import Component

HIDDEN, BIG = 64, 2048  # the teacher: ~16 MiB of fp32 weights, far above the heap's noise
STEPS = 4


def _student() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(HIDDEN, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


def _teacher(shared: torch.nn.Module | None = None) -> torch.nn.Module:
    torch.manual_seed(1)
    body = torch.nn.Sequential(torch.nn.Linear(HIDDEN, BIG), torch.nn.ReLU(), torch.nn.Linear(BIG, BIG))
    head = shared if shared is not None else torch.nn.Linear(BIG, 10)
    teacher = torch.nn.Sequential(body, torch.nn.ReLU(), torch.nn.BatchNorm1d(BIG), head)
    return teacher.eval().requires_grad_(False)


def _distill(
    student: torch.nn.Module,
    teacher: torch.nn.Module | None,
    tracker_of: object = None,
    late_teacher: object = None,
    steps: int = STEPS,
) -> tuple[list[float], anatomy.Tracker | None, list[dict[str, int | None]]]:
    """A plain distillation loop: KL to the teacher's soft labels plus the hard loss. ``tracker_of(student,
    opt)`` makes the tracker; ``late_teacher(tracker)`` returns a teacher made after the first steps."""
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    tracker = tracker_of(student, opt) if callable(tracker_of) else None
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(32, HIDDEN, generator=g), torch.randint(0, 10, (32,), generator=g)
    losses, at_peak = [], []
    for step in range(steps):
        if step == 2 and callable(late_teacher):
            teacher = late_teacher(tracker)
        if tracker is not None:
            tracker.begin_step()
        logits = student(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        if teacher is not None:
            with torch.no_grad():
                soft = teacher(x).softmax(-1)
            loss = loss + torch.nn.functional.kl_div(logits.log_softmax(-1), soft, reduction="batchmean")
        loss.backward()
        opt.step()
        opt.zero_grad()
        if tracker is not None:
            tracker.end_step()
            snap = tracker.latest
            at_peak.append(dict(snap.at_peak or {}) if snap is not None else {})
        losses.append(float(loss.detach()))
    return losses, tracker, at_peak


def test_a_teacher_given_at_track_is_other_models_not_runtime() -> None:
    teacher = _teacher()
    plain, _, _ = _distill(_student(), teacher)
    expected = module_bytes(teacher)
    gc.collect()

    def registered(student: torch.nn.Module, opt: object) -> anatomy.Tracker:
        return anatomy.track(student, opt, publish=False, others={"teacher": teacher})

    losses, tracker, at_peak = _distill(_student(), teacher, registered)
    assert tracker is not None
    assert losses == plain  # bit-identical
    hello, snap = tracker.hello, tracker.history[-1]
    runtime_named = snap.memory[Component.RUNTIME.value]
    tracker.close()
    assert hello.other_models == {"teacher": expected}
    assert snap.memory[Component.OTHER_MODELS.value] == expected
    assert at_peak[-1][Component.OTHER_MODELS.value] == expected
    assert sum(v or 0 for v in at_peak[-1].values()) == snap.peak_bytes  # the rows still sum to the peak
    gc.collect()

    # The same job, the teacher not named: its bytes land in the runtime baseline (the defect).
    def unnamed(student: torch.nn.Module, opt: object) -> anatomy.Tracker:
        return anatomy.track(student, opt, publish=False)

    _, tracker2, _ = _distill(_student(), teacher, unnamed)
    assert tracker2 is not None
    runtime_unnamed = tracker2.history[-1].memory[Component.RUNTIME.value]
    tracker2.close()
    assert runtime_named is not None and runtime_unnamed is not None
    assert runtime_unnamed - runtime_named == pytest.approx(expected, rel=0.1)


def test_a_teacher_added_later_is_other_models_not_unattributed() -> None:
    made: list[torch.nn.Module] = []

    def late(tracker: anatomy.Tracker | None) -> torch.nn.Module:
        made.append(_teacher())
        if tracker is not None:
            tracker.add_model("teacher", made[-1])
        return made[-1]

    plain, _, _ = _distill(_student(), None, late_teacher=late)

    def track(student: torch.nn.Module, opt: object) -> anatomy.Tracker:
        return anatomy.track(student, opt, publish=False)

    losses, tracker, at_peak = _distill(_student(), None, track, late_teacher=late)
    assert tracker is not None and losses == plain
    expected = module_bytes(made[-1])
    hello, snap = tracker.hello, tracker.history[-1]
    tracker.close()
    assert hello.other_models == {"teacher": expected}
    assert snap.memory[Component.OTHER_MODELS.value] == expected
    before, after = at_peak[1], at_peak[-1]
    assert Component.OTHER_MODELS.value not in before
    assert after[Component.OTHER_MODELS.value] == expected
    unattributed = after[Component.UNATTRIBUTED.value] or 0
    assert unattributed - (before[Component.UNATTRIBUTED.value] or 0) < expected / 10


def test_storages_shared_with_the_student_count_once() -> None:
    """A teacher that shares the student's head: only what it adds is another model's."""
    shared = torch.nn.Linear(BIG, 10)
    # the student's own weights include the shared head
    student = torch.nn.ModuleDict({"net": _student(), "head": shared})
    teacher = _teacher(shared=shared)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    tracker = anatomy.track(student, opt, publish=False, others={"teacher": teacher})
    with tracker.step():
        loss = student["net"](torch.randn(4, HIDDEN)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
    snap, hello = tracker.history[-1], tracker.hello
    tracker.close()
    added = module_bytes(teacher, exclude=student)
    assert snap.memory[Component.OTHER_MODELS.value] == added < module_bytes(teacher)
    assert snap.memory[Component.WEIGHTS.value] == module_bytes(student)
    assert hello.other_models == {"teacher": module_bytes(teacher, exclude=student)}


def test_the_trainer_callback_registers_a_subclass_teacher(tmp_path: object) -> None:
    """The HF Trainer callback names every other module the Trainer holds (a subclass's ``teacher``)."""
    from transformers import Trainer, TrainingArguments

    teacher = _teacher()

    class _Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 16

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            g = torch.Generator().manual_seed(i)
            return {"x": torch.randn(HIDDEN, generator=g), "labels": torch.tensor(i % 10)}

    class _Student(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _student()

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            logits = self.net(x)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    class _Distiller(Trainer):
        def __init__(self, *args: object, teacher: torch.nn.Module, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)
            self.teacher = teacher

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):  # type: ignore[no-untyped-def]
            out = model(**inputs)
            with torch.no_grad():
                soft = self.teacher(inputs["x"]).softmax(-1)
            kl = torch.nn.functional.kl_div(out["logits"].log_softmax(-1), soft, reduction="batchmean")
            loss = out["loss"] + kl
            return (loss, out) if return_outputs else loss

    def run(callbacks: list[object] | None) -> tuple[list[float], object]:
        args = TrainingArguments(
            output_dir=str(tmp_path),
            per_device_train_batch_size=4,
            max_steps=3,
            report_to="none",
            use_cpu=True,
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            seed=0,
        )
        trainer = _Distiller(
            model=_Student(), args=args, train_dataset=_Data(), callbacks=callbacks, teacher=teacher
        )
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer

    plain, _ = run(None)
    callback = anatomy.AnatomyCallback(publish=False)
    losses, _ = run([callback])
    assert losses == plain and len(losses) == 3
    tracker = callback.tracker
    assert tracker is not None
    assert tracker.hello.other_models == {"teacher": module_bytes(teacher)}
    assert tracker.history[-1].memory[Component.OTHER_MODELS.value] == module_bytes(teacher)


def test_many_other_models_still_publish() -> None:
    """More models than a hello names (the protocol's limit): the hello names the first ones, the
    component sums them all, and the hello still encodes."""
    from anatomy import protocol

    student = _student()
    others = {f"ema{i}": torch.nn.Linear(4, 4) for i in range(protocol.MAX_OTHER_MODELS + 3)}
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    tracker = anatomy.track(student, opt, publish=False, others=others)
    with tracker.step():
        student(torch.randn(2, HIDDEN)).sum().backward()
        opt.step()
    hello, snap = tracker.hello, tracker.history[-1]
    tracker.close()
    assert hello.other_models is not None and len(hello.other_models) == protocol.MAX_OTHER_MODELS
    assert protocol.decode(protocol.encode(hello).rstrip(b"\n")) == hello
    assert snap.memory[Component.OTHER_MODELS.value] == module_bytes(*others.values())
