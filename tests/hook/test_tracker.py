"""The plain-loop way in: snapshots, timing, op groups, accumulation, degradation, ANATOMY_TOP=0."""

from __future__ import annotations

import dataclasses
import gc
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import anatomy
from anatomy import protocol
from anatomy.hook.backend import HeapBackend
from anatomy.hook.guard import Guard
from anatomy.hook.heap import HostHeap
from anatomy.vocabulary import Component, OpGroup, Phase

VOCAB = 2000


def _bert(hk: SimpleNamespace) -> torch.nn.Module:
    return hk.small_bert(vocab=VOCAB)


def _batch(hk: SimpleNamespace, batch: int = 4) -> dict[str, torch.Tensor]:
    b = hk.bert_batch(batch=batch)
    b["input_ids"] = b["input_ids"] % VOCAB
    return b


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_plain_loop_snapshot_contents(hk: SimpleNamespace) -> None:
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    batch = _batch(hk)
    n = sum(p.numel() for p in model.parameters())
    # Five steps: step 3 is due a sampled step, which the budget may let run or hold back (it weighs step 0's
    # cold time against step 2's): either way one of steps 3 and 4 is an ordinary step, whose time the
    # achieved TFLOP/s needs (none is known while every step after the first was sampled).
    with anatomy.track(model, opt, publish=False, sample_every=3) as tracker:
        hk.train_steps(model, opt, 5, tracker, batch=batch)
        snap = tracker.latest
        history = list(tracker.history)
    assert snap is not None and snap.step == 4 and snap.error is None
    # The snapshot is a valid protocol message.
    assert protocol.decode(protocol.encode(snap)) == snap

    mem = snap.memory
    assert mem[Component.GRADIENTS.value] == 4 * n
    states = mem[Component.OPTIMIZER_STATES.value]
    assert states is not None and states - 4 * len(list(model.parameters())) == 8 * n
    assert mem[Component.ACTIVATIONS.value] is not None and mem[Component.ACTIVATIONS.value] > 0
    # Unmeasurable on CPU: None, never 0.
    assert mem[Component.CUDA_CONTEXT.value] is None
    assert mem[Component.ALLOCATOR_CACHE.value] is None
    assert snap.cuda is None
    assert snap.memory_source == "glibc"
    assert mem[Component.TEMPORARIES.value] is not None
    model_state = mem[Component.WEIGHTS.value] + states  # type: ignore[operator]
    assert snap.peak_bytes is not None and snap.peak_bytes >= model_state
    assert snap.peak_phase in {Phase.FORWARD.value, Phase.BACKWARD.value, Phase.OPTIMIZER.value}
    assert snap.expected_bytes_per_param[Component.OPTIMIZER_STATES.value] == 8.0
    assert snap.expected_bytes_per_param[Component.WEIGHTS.value] == 4.0
    assert snap.parameter_count == n
    assert len(history) >= 1 and history[-1] is snap

    t = snap.timing
    assert t.step_s is not None and t.forward_s and t.backward_s and t.optimizer_s
    parts = t.forward_s + t.backward_s + t.optimizer_s
    assert 0.5 * t.step_s < parts <= t.step_s * 1.0001
    # Samples and tokens inferred from the forward's input_ids.
    assert t.samples_per_s == pytest.approx(hk.BATCH / t.step_s)
    assert t.tokens_per_s == pytest.approx(hk.BATCH * hk.SEQ / t.step_s)

    # Op groups from a sampled step (step 1, then the 3rd, or the 4th where the budget held it back):
    # contractions dominate FLOPs.
    assert snap.op_groups is not None and snap.op_groups_step in (1, 3, 4)
    flops = {k: v.flops or 0.0 for k, v in snap.op_groups.items()}
    assert flops[OpGroup.CONTRACTION.value] / sum(flops.values()) > 0.9
    assert snap.achieved_tflops is not None and snap.achieved_tflops > 0
    assert snap.mfu is None  # no peak for a CPU


def test_explicit_samples_and_tokens(hk: SimpleNamespace) -> None:
    model = _bert(hk)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = _batch(hk)
    with anatomy.track(model, opt, publish=False, sample_every=0) as tracker:
        for _ in range(2):
            with tracker.step(samples=10, tokens=1000):
                model(**batch).loss.backward()
                opt.step()
                opt.zero_grad()
        snap = tracker.latest
    assert snap is not None and snap.timing.step_s
    assert snap.timing.samples_per_s == pytest.approx(10 / snap.timing.step_s)
    assert snap.timing.tokens_per_s == pytest.approx(1000 / snap.timing.step_s)
    assert snap.op_groups is None  # sampling disabled


def test_loop_without_step_context_is_stepped_by_hooks(hk: SimpleNamespace) -> None:
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    batch = _batch(hk)
    tracker = anatomy.track(model, opt, publish=False, sample_every=0)
    for _ in range(3):
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    with torch.no_grad():
        model(**batch)  # evaluation: not a step
    snap = tracker.latest
    tracker.close()
    assert snap is not None and snap.step == 2
    assert snap.memory[Component.ACTIVATIONS.value]
    assert snap.timing.optimizer_s is not None
    assert not model._forward_pre_hooks and not model._forward_hooks  # close() detached everything


def test_gradient_accumulation(hk: SimpleNamespace) -> None:
    batch = _batch(hk)
    n = sum(p.numel() for p in _bert(hk).parameters())
    results = {}
    for accum in (1, 3):
        model = _bert(hk)
        opt = torch.optim.AdamW(model.parameters())
        with anatomy.track(model, opt, publish=False, sample_every=0, grad_accum_steps=accum) as tracker:
            hk.train_steps(model, opt, 2, tracker, batch=batch, accum=accum)
            results[accum] = tracker.latest
    one, three = results[1], results[3]
    assert one is not None and three is not None
    assert three.grad_accum_steps == 3 and one.grad_accum_steps == 1
    assert three.memory[Component.GRADIENTS.value] == 4 * n
    # Activations are those of one micro-batch, not three.
    assert three.memory[Component.ACTIVATIONS.value] == pytest.approx(
        one.memory[Component.ACTIVATIONS.value], rel=0.01
    )
    # Three forwards per step: the samples counted are three micro-batches'.
    t = three.timing
    assert t.samples_per_s == pytest.approx(3 * hk.BATCH / t.step_s)


def test_measurement_failure_never_reaches_training(
    hk: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    batch = _batch(hk)
    reference = _bert(hk)
    ref_opt = torch.optim.AdamW(reference.parameters())
    ref_losses = hk.train_steps(reference, ref_opt, 3, batch=batch)

    def broken(*args: object, **kwargs: object) -> int:
        raise RuntimeError("state walk exploded")

    monkeypatch.setattr("anatomy.hook.attach.optimizer_state_bytes", broken)
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    with (
        caplog.at_level(logging.WARNING, logger="anatomy"),
        anatomy.track(model, opt, publish=False, sample_every=0) as tracker,
    ):
        losses = hk.train_steps(model, opt, 3, tracker, batch=batch)
        snap = tracker.latest
    assert losses == ref_losses
    for a, b in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert snap is not None
    assert snap.memory[Component.OPTIMIZER_STATES.value] is None  # unmeasured, not 0
    assert snap.memory[Component.GRADIENTS.value] is not None  # the rest still measured
    assert snap.error is not None and "state walk exploded" in snap.error
    assert sum("state walk exploded" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_tracked_training_is_bit_identical(hk: SimpleNamespace) -> None:
    batch = _batch(hk)
    a, b = _bert(hk), _bert(hk)
    opt_a, opt_b = torch.optim.AdamW(a.parameters()), torch.optim.AdamW(b.parameters())
    torch.manual_seed(123)  # dropout draws from the global generator
    losses_a = hk.train_steps(a, opt_a, 3, batch=batch)
    torch.manual_seed(123)
    with anatomy.track(b, opt_b, sample_every=1, interval_s=0.01) as tracker:  # profiled every step
        losses_b = hk.train_steps(b, opt_b, 3, tracker, batch=batch)
    assert losses_a == losses_b
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))


def test_disabled_by_environment(
    hk: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, runtime_dir: Path
) -> None:
    batch = _batch(hk)
    reference = _bert(hk)
    ref_opt = torch.optim.AdamW(reference.parameters())
    ref_losses = hk.train_steps(reference, ref_opt, 2, batch=batch)

    monkeypatch.setenv("ANATOMY_TOP", "0")
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    tracker = anatomy.track(model, opt)
    assert isinstance(tracker, anatomy.Tracker) and not tracker.enabled
    assert not model._forward_pre_hooks and not model._forward_hooks
    losses = hk.train_steps(model, opt, 2, tracker, batch=batch)
    tracker.begin_step()
    tracker.end_step()
    assert tracker.latest is None and not tracker.history
    tracker.close()
    assert losses == ref_losses
    assert all(torch.equal(x, y) for x, y in zip(reference.parameters(), model.parameters(), strict=True))
    assert not runtime_dir.exists() or not list(runtime_dir.iterdir())


def test_publishes_to_a_reader(hk: SimpleNamespace, runtime_dir: Path) -> None:
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    batch = _batch(hk)
    tracker = anatomy.track(model, opt, interval_s=0.01, sample_every=0)
    hk.train_steps(model, opt, 1, tracker, batch=batch)
    path = tracker.socket_path
    assert path is not None and path.parent == runtime_dir
    assert protocol.discover(runtime_dir) == [path]
    with protocol.Reader(path) as reader:
        reader.wait()
        assert reader.hello is not None and reader.hello.optimizer == "adamw"
        assert reader.hello.optimizer_class == "AdamW"
        assert reader.hello.model_class == "BertForSequenceClassification"
        assert reader.hello.precision == "fp32" and reader.hello.device == "cpu"
        assert reader.hello.parameter_count == sum(p.numel() for p in model.parameters())
        hk.train_steps(model, opt, 3, tracker, batch=batch)
        reader.wait()
        import time

        deadline = time.monotonic() + 5
        while (reader.snapshot is None or reader.snapshot.step < 3) and time.monotonic() < deadline:
            reader.poll()
            time.sleep(0.02)
        assert reader.snapshot is not None and reader.snapshot.step == 3
    tracker.close()
    assert not path.exists()


def test_activations_recounted_when_the_input_shape_changes(hk: SimpleNamespace) -> None:
    """Saved tensors are counted on the first steps, on a new input shape, and once per interval."""
    model = _bert(hk)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    small, large = _batch(hk, batch=2), _batch(hk, batch=6)
    seen: list[int | None] = []
    with anatomy.track(model, opt, publish=False, sample_every=0, interval_s=3600) as tracker:
        for batch in (small, small, small, small, large, large):
            hk.train_steps(model, opt, 1, tracker, batch=batch)
            snap = tracker.latest
            assert snap is not None
            seen.append(snap.memory[Component.ACTIVATIONS.value])
        last = tracker.latest
        counted = [last.activations_step if last is not None and last.step == 5 else None]
    a_small, a_large = seen[0], seen[4]
    assert a_small and a_large and a_large > 2.5 * a_small  # 3x the batch
    assert seen[:4] == [a_small] * 4  # step 3 not counted: the last count stands
    assert seen[5] == a_large
    assert counted == [4]  # the last step (same shape, same interval) did not count: step 4's count stands


def test_no_memory_growth_over_steps(hk: SimpleNamespace) -> None:
    """Nothing per step is retained: the heap after 25 steps is where it was after 5 (the bounded
    snapshot history aside)."""
    from anatomy.hook.heap import HostHeap

    heap = HostHeap()
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    batch = _batch(hk, batch=2)
    with anatomy.track(model, opt, interval_s=0.0, sample_every=4) as tracker:
        hk.train_steps(model, opt, 5, tracker, batch=batch)
        before = heap.in_use()
        hk.train_steps(model, opt, 20, tracker, batch=batch)
        after = heap.in_use()
        assert len(tracker.history) == 25
    assert before is not None and after is not None
    activations = tracker.latest.memory[Component.ACTIVATIONS.value] if tracker.latest else None
    assert activations and after - before < min(activations, 1_000_000)


def test_model_moved_after_track_is_remeasured(hk: SimpleNamespace) -> None:
    model = _bert(hk)
    tracker = anatomy.track(model, publish=False, sample_every=0)
    model.to(torch.float64)  # new storages (as .to("cuda") would make): the tracker must notice
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    tracker.attach_optimizer(opt)
    batch = _batch(hk)
    for _ in range(4):
        with tracker.step():
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
    snap = tracker.latest
    tracker.close()
    assert snap is not None
    n = sum(p.numel() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert snap.memory[Component.WEIGHTS.value] == 8 * n + buffers
    assert snap.memory[Component.GRADIENTS.value] == 8 * n
    assert snap.memory[Component.OPTIMIZER_STATES.value] == 0
    # Parameters are not activations, even though their storages changed after track().
    from anatomy.hook.saved import SavedTensorCounter
    from anatomy.hook.saved_values import input_storage_keys

    fresh = SavedTensorCounter([*model.parameters(), *model.buffers()])
    fresh.set_inputs(input_storage_keys((), batch))  # the batch is inputs, not activations
    with fresh:
        model(**batch).loss.backward()
    assert snap.memory[Component.ACTIVATIONS.value] == fresh.activation_bytes


def test_advisor_suggestions_attached_and_its_failures_contained(
    hk: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anatomy.advisor

    calls: list[tuple[object, ...]] = []

    def advise(hello: protocol.Hello, snap: protocol.Snapshot, history: object, savings: object) -> list:
        calls.append((hello, snap, history))
        acts = snap.memory[Component.ACTIVATIONS.value]
        return [protocol.Suggestion("test", "checkpoint", f"{acts}", "measured", saving_bytes=acts)]

    monkeypatch.setattr(anatomy.advisor, "advise", advise)
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    # interval 0: the advisor runs on every step's snapshot (else once per publish interval)
    with anatomy.track(model, opt, publish=False, sample_every=0, interval_s=0.0) as tracker:
        hk.train_steps(model, opt, 2, tracker, batch=_batch(hk))
        snap = tracker.latest
        assert snap is not None and len(snap.suggestions) == 1
        assert snap.suggestions[0].saving_bytes == snap.memory[Component.ACTIVATIONS.value]
        assert calls and calls[-1][0] is tracker.hello

        def broken(*args: object) -> list:
            raise ZeroDivisionError("advisor bug")

        monkeypatch.setattr(anatomy.advisor, "advise", broken)
        hk.train_steps(model, opt, 1, tracker, batch=_batch(hk))
        snap = tracker.latest
    assert snap is not None and snap.step == 2 and snap.suggestions == []
    assert snap.error is not None and "advisor bug" in snap.error


def test_every_step_is_published_and_close_sends_the_last(hk: SimpleNamespace, runtime_dir: Path) -> None:
    """Steps far shorter than the publish interval: each one still reaches the step feed the publisher
    follows, and after close() a reader holds the final step (the one a monitor shows when training
    stopped)."""
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    batch = _batch(hk)
    tracker = anatomy.track(model, opt, interval_s=60.0, sample_every=0)
    hk.train_steps(model, opt, 1, tracker, batch=batch)
    pub = tracker.publisher
    assert pub is not None and tracker.socket_path is not None
    with protocol.Reader(tracker.socket_path) as reader:
        reader.wait()
        hk.train_steps(model, opt, 4, tracker, batch=batch)
        # every finished step, though the interval is a minute
        assert [s.step for s in tracker.history] == [0, 1, 2, 3, 4]
        tracker.close()
        import time

        deadline = time.monotonic() + 5
        while (reader.snapshot is None or reader.snapshot.step < 4) and time.monotonic() < deadline:
            reader.poll()
            time.sleep(0.02)
        assert reader.snapshot is not None and reader.snapshot.step == 4
        at_peak = reader.snapshot.at_peak
        assert at_peak is not None and sum(v or 0 for v in at_peak.values()) == reader.snapshot.peak_bytes


def test_defaults_and_the_traced_step_leaves_nothing_behind(hk: SimpleNamespace) -> None:
    import inspect

    assert inspect.signature(anatomy.track).parameters["sample_every"].default == 100
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    backends: list[HeapBackend] = []

    def heap_backend(device: torch.device, guard: Guard) -> HeapBackend:
        backends.append(HeapBackend(HostHeap(), guard))
        return backends[-1]

    with anatomy.Tracker(model, opt, publish=False, memory_backend=heap_backend) as tracker:
        assert tracker.sample_every == 100
        hk.train_steps(model, opt, 4, tracker, batch=_batch(hk))  # step 1 is profiled, step 2 traced
        snap = tracker.latest
        assert snap is not None and snap.op_groups_step == 1
        assert len(backends) == 1 and backends[0].traced is not None
        assert backends[0].traced.step == 2  # the one trace so far, and it is step 2's
        # The split shown is the trace's unless step 3's heap readings rose >10% above the traced peak
        # (glibc's in-use figure includes other threads' allocations: a loaded CI machine sees that).
        assert snap.at_peak_step in (2, 3)
        counter = tracker.activation_counter
        assert not counter.track_alive and counter.alive_activation_bytes == 0
        assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


def test_split_at_peak_under_gradient_accumulation(hk: SimpleNamespace) -> None:
    """Two micro-batches: the split still sums to the peak; at a peak inside the step the first
    micro-batch's gradients are held with the second one's activations."""
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    # Two near-equal peaks (micro-batch 1's backward, micro-batch 2's forward): garbage of earlier tests
    # collected mid-step could tip the heap's highest reading to the wrong one. Measure a collected heap.
    gc.collect()
    gc.disable()
    try:
        with anatomy.track(model, opt, publish=False, sample_every=2) as tracker:
            hk.train_steps(model, opt, 4, tracker, batch=_batch(hk, batch=16), accum=2)
            history = list(tracker.history)
    finally:
        gc.enable()
    assert len(history) == 4
    for snap in history:
        assert snap.at_peak is not None and snap.peak_bytes is not None
        assert sum(v or 0 for v in snap.at_peak.values()) == snap.peak_bytes
        assert all(v is not None and v >= 0 for v in snap.at_peak.values())
    assert history[-1].at_peak_step in (2, 3)  # 3: another thread's allocations lifted step 3's readings
    last = history[2]  # step 2's traced split (step 1 was profiled)
    assert last.at_peak is not None and last.step == last.at_peak_step == 2
    assert last.peak_phase in ("forward", "backward")  # activations of 16 samples top AdamW's temporaries
    assert last.at_peak[Component.GRADIENTS.value] == tracker.sums.gradients  # micro-batch 1's
    assert last.at_peak[Component.ACTIVATIONS.value] > 0.5 * (last.memory[Component.ACTIVATIONS.value] or 0)


def test_split_at_peak_on_the_wire_is_optional_and_validated() -> None:
    base = protocol.Snapshot(
        pid=1, seq=1, time=0.0, step=3, memory={"weights": 10}, expected_bytes_per_param={}, parameter_count=2
    )
    assert protocol.decode(protocol.encode(base)) == base  # an older hook's snapshot: no split
    split = {"weights": 10, "activations": None, "temporaries": 5, "unattributed": 7}
    snap = dataclasses.replace(base, at_peak=split, at_peak_step=2, peak_bytes=22)
    assert protocol.decode(protocol.encode(snap)) == snap
    for bad in ({"weights": -1}, {"nonsense": 1}, {"weights": 1.5}):
        d = protocol.to_dict(dataclasses.replace(base, at_peak=bad))  # type: ignore[arg-type]
        with pytest.raises(protocol.ProtocolError):
            protocol.from_dict(d)
    d = protocol.to_dict(base)
    d["at_peak_step"] = "2"
    with pytest.raises(protocol.ProtocolError):
        protocol.from_dict(d)


def test_advisor_runs_once_per_interval_while_every_step_is_built(
    hk: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import anatomy.advisor

    calls: list[int] = []

    def advise(hello: object, snap: protocol.Snapshot, history: object, savings: object) -> list:
        calls.append(snap.step)
        return [protocol.Suggestion("test", "t", "d", "measured")]

    monkeypatch.setattr(anatomy.advisor, "advise", advise)
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    with anatomy.track(model, opt, publish=False, sample_every=0, interval_s=60.0) as tracker:
        hk.train_steps(model, opt, 4, tracker, batch=_batch(hk))
        steps = [s.step for s in tracker.history]
        assert steps == [0, 1, 2, 3]  # every step built
        assert calls == [0]  # the advisor once in the interval; its suggestions stand
        assert all(len(s.suggestions) == 1 for s in tracker.history)


class _CountingHeap:
    """A HostHeap that keeps every reading, with the step it was taken in (``tracker``: set once made)."""

    def __init__(self) -> None:
        self.heap = HostHeap()
        self.tracker: anatomy.Tracker | None = None
        self.reads: list[tuple[int, int]] = []

    @property
    def available(self) -> bool:
        return self.heap is not None and self.heap.available

    def in_use(self) -> int | None:
        assert self.heap is not None
        now = self.heap.in_use()
        if now is not None and self.tracker is not None:
            self.reads.append((self.tracker.steps_done, now))  # (the step in progress has this index)
        return now


def test_heap_is_read_on_first_steps_and_shape_changes_not_every_step(hk: SimpleNamespace) -> None:
    """On CPU the heap (mallinfo2, ~0.1 ms a read) is read at the boundaries of the first steps and
    after a shape change; a step in between reports the last read step's figures and says so."""
    model = _bert(hk)
    opt = torch.optim.AdamW(model.parameters())
    counting = _CountingHeap()
    tracker = anatomy.Tracker(
        model,
        opt,
        publish=False,
        sample_every=0,
        interval_s=3600.0,
        memory_backend=lambda device, guard: HeapBackend(counting, guard),  # type: ignore[arg-type]
    )
    counting.tracker = tracker
    hk.train_steps(model, opt, 8, tracker, batch=_batch(hk))
    history = list(tracker.history)
    read_steps = sorted({step for step, _ in counting.reads})
    assert read_steps == [0, 1, 2]  # the warm-up steps only: steps 3..7 read nothing
    step2 = history[2]
    readings2 = [now for step, now in counting.reads if step == 2]
    assert len(readings2) >= 3 and step2.peak_bytes == max(readings2)
    last = history[-1]
    assert last.step == 7 and last.memory_source == "glibc"
    assert last.at_peak_step == 2 and last.peak_bytes == step2.peak_bytes
    assert last.memory[Component.TEMPORARIES.value] == step2.memory[Component.TEMPORARIES.value]
    assert last.at_peak is not None and sum(v or 0 for v in last.at_peak.values()) == last.peak_bytes
    # A new input shape: that step reads the heap again and reports its own peak.
    hk.train_steps(model, opt, 1, tracker, batch=_batch(hk, batch=16))
    tracker.close()
    readings8 = [now for step, now in counting.reads if step == 8]
    snap = tracker.latest
    assert len(readings8) >= 3
    assert snap is not None and snap.step == 8 and snap.at_peak_step == 8
    assert snap.peak_bytes == max(readings8)


def test_a_broken_module_of_the_package_is_not_swallowed(tmp_path: Path) -> None:
    """Every part of the hook is imported as code, not probed: an import error inside anatomy is a bug
    that fails loudly at set-up (before, it silently became 'advisor unavailable' at debug level)."""
    import subprocess
    import sys

    script = """
import sys, torch
sys.modules["anatomy.advisor"] = None  # as if anatomy/advisor.py failed to import
import anatomy
try:
    anatomy.track(torch.nn.Linear(2, 2), publish=False)
except ImportError as exc:
    print("ImportError", exc.name)
else:
    print("swallowed")
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=str(tmp_path)
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ImportError anatomy.advisor"
