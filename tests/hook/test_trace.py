"""anatomy.hook.trace: the per-op memory trace reads after the ops that can allocate, and after each
phase's first op; a view, an in-place or an out= op into a tensor of the right size is not read after."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from anatomy.hook import trace as trace_module
from anatomy.hook.heap import HostHeap
from anatomy.hook.trace import MemoryTrace
from anatomy.vocabulary import Phase


class Ran(TorchDispatchMode):
    """Below the trace on the mode stack: the ops in the order they ran."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.ops.append(str(func))
        return out


def test_reads_follow_the_ops_that_may_allocate_and_each_phases_first_op() -> None:
    ran = Ran()
    after: list[str] = []
    trace = MemoryTrace(read=lambda: after.append(ran.ops[-1]) or len(after))
    x = torch.randn(8, 8)
    buf = torch.empty(8, 8)
    with ran, trace:
        y = x.t()  # a view, but the trace's first op: read
        z = y @ x  # allocates
        z.add_(1.0)  # in place
        torch.mm(x, x, out=buf)  # an out= overload: may resize, read
        z.view(64)
        trace.phase = Phase.BACKWARD
        w = z.view(64)  # the new phase's first op: read
        w.expand(2, 64)
        w.sum()  # allocates
    assert after == [
        "aten.t.default",
        "aten.mm.default",
        "aten.mm.out",
        "aten.view.default",
        "aten.sum.default",
    ]
    assert trace.peaks == {Phase.OTHER: 3, Phase.BACKWARD: 5}


def test_a_training_steps_traced_peaks_are_the_ones_every_op_read_gives() -> None:
    """The heap's peak per phase, read after the ops that may allocate, is the one read after every op
    (a read skipped never saw more), within what Python itself allocates between two runs of a step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    x = torch.randn(64, 512)
    heap = HostHeap()
    assert heap.available

    def step(every_op: bool) -> tuple[dict[Phase, int], int]:
        trace = MemoryTrace(read=heap.in_use)
        original = trace_module._allocates
        if every_op:
            trace_module._allocates = lambda func: True  # type: ignore[assignment]
        trace_module._ALLOCATES.clear()
        try:
            with trace:
                trace.phase = Phase.FORWARD
                loss = model(x).square().mean()
                trace.phase = Phase.BACKWARD
                loss.backward()
        finally:
            trace_module._allocates = original  # type: ignore[assignment]
            trace_module._ALLOCATES.clear()
        model.zero_grad(set_to_none=True)
        return trace.peaks, trace.reads

    step(every_op=False)  # (the first run's one-time allocations)
    every, every_reads = step(every_op=True)
    some, some_reads = step(every_op=False)
    assert some.keys() == every.keys() == {Phase.FORWARD, Phase.BACKWARD}
    for phase in every:  # peaks of several MB (the activations: 64 x 1024 floats a tensor)
        assert abs(some[phase] - every[phase]) < 64 * 1024, phase
    assert some_reads < every_reads


def test_the_heap_reader_is_read_less_often_on_a_transformer_step() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                         num_hidden_layers=2, vocab_size=128)  # fmt: skip
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 128, (2, 8))
    heap = HostHeap()
    ran = Ran()
    trace = MemoryTrace(read=heap.in_use)
    with ran, trace:
        model(input_ids=ids, labels=ids).loss.backward()
    assert 0 < trace.reads < 0.75 * len(ran.ops)  # (a tiny Llama: about half its ops allocate nothing)


def _traced_with_the_stride_forced(
    step: Any, off: tuple[str, ...] = (), forced: bool = True
) -> tuple[int, int]:
    """``step(trace)`` traced (its highest peak, its reads), with every read beyond the first skipped as a
    loaded machine skips them (the stride at its most; ``forced`` False: every op read) and the reads
    ``MemoryTrace`` makes anyway named in ``off`` (``_large``, ``_may_top``) not made."""
    heap = HostHeap()
    assert heap.available
    with pytest.MonkeyPatch.context() as m:
        if forced:
            m.setattr(trace_module, "GRACE_READS", 0)
            m.setattr(trace_module, "GRACE_S", 0.0)
            m.setattr(trace_module, "READ_SHARE", 0.0)  # (any read costs more than the step allows)
        else:
            m.setattr(trace_module, "_allocates", lambda func: True)
            trace_module._ALLOCATES.clear()
        for name in off:
            m.setattr(MemoryTrace, name, lambda self, *args: False)
        trace = MemoryTrace(read=heap.in_use)
        step(trace)
    trace_module._ALLOCATES.clear()
    return max(trace.peaks.values()), trace.reads


def test_a_large_result_is_read_after_whatever_the_stride() -> None:
    """A loaded machine's slow reads raise the stride; the op that makes a big transient is read after all
    the same (else the peak reads low by its size: a QLoRA Llama's by 1 MiB, 17%)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4096))
    x = torch.randn(64, 64)

    def step(trace: MemoryTrace) -> None:  # (the peak: the logits and their log-softmax, 1 MiB each)
        with torch.no_grad(), trace:
            trace.phase = Phase.FORWARD
            model(x).log_softmax(-1).mean()

    step(MemoryTrace(read=lambda: 0))  # (the first run's one-time allocations)
    every, every_reads = _traced_with_the_stride_forced(step, forced=False)
    skipped, _ = _traced_with_the_stride_forced(step, off=("_large", "_may_top"))
    assert skipped < every - 512 * 1024  # (the test's premise: the stride alone misses it)
    traced, reads = _traced_with_the_stride_forced(step, off=("_may_top",))
    assert abs(traced - every) < 64 * 1024 and reads < every_reads


def test_past_the_forward_what_skipped_ops_allocated_is_read_where_it_may_top_the_step() -> None:
    """A deep model's peak (in its backward, no one result large) read at the stride's most, as every op's
    read gives it, in far fewer reads."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(16):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    x = torch.randn(256, 256)

    def step(trace: MemoryTrace) -> None:
        with trace:
            trace.phase = Phase.FORWARD
            loss = model(x).square().mean()
            trace.phase = Phase.BACKWARD
            loss.backward()
        model.zero_grad(set_to_none=True)

    step(MemoryTrace(read=lambda: 0))
    every, every_reads = _traced_with_the_stride_forced(step, forced=False)
    skipped, _ = _traced_with_the_stride_forced(step, off=("_large", "_may_top"))
    assert skipped < every - 256 * 1024  # (the premise: a gradient's worth and more missed)
    traced, reads = _traced_with_the_stride_forced(step, off=("_large",))
    assert abs(traced - every) < 64 * 1024
    assert reads < every_reads / 2
