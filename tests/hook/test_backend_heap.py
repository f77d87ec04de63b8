"""The CPU backend: the heap in use before the first step is the runtime row (interpreter, torch,
libraries, data), so that unattributed is only what grew since and nothing explains."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from types import SimpleNamespace

import torch

import anatomy
from anatomy.vocabulary import Component


def _heap_in_use() -> int:
    """The test's own reading of glibc's heap (mallinfo2 through ctypes)."""

    names = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (*names, "keepcost")]

    fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    fn.restype = Mallinfo2
    info = fn()
    return int(info.uordblks) + int(info.hblkhd)


def test_runtime_row_is_the_heap_before_the_first_step(hk: SimpleNamespace) -> None:
    # Garbage left by earlier tests, collected in the middle of a step, would shrink the heap below the
    # baseline (the split then caps the runtime row at what is there); start from a collected heap.
    gc.collect()
    model = hk.small_bert(vocab=2000)
    opt = torch.optim.AdamW(model.parameters())
    batch = hk.bert_batch()
    batch["input_ids"] = batch["input_ids"] % 2000
    tracker = anatomy.track(model, opt, publish=False, sample_every=2)
    heap_before = _heap_in_use()
    hk.train_steps(model, opt, 5, tracker, batch=batch)
    history = list(tracker.history)
    tracker.close()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights += sum(b.numel() * b.element_size() for b in model.buffers())
    inputs = history[0].memory[Component.INPUTS.value] or 0
    runtime = history[-1].memory[Component.RUNTIME.value]
    # no optimizer state and no gradient before the first step: the heap was runtime + weights + batch
    assert runtime is not None and runtime > 10 * 2**20  # interpreter, torch, transformers
    assert abs(runtime - (heap_before - weights - inputs)) < 2**20  # the hook's own few allocations
    for snap in history:
        assert snap.memory[Component.RUNTIME.value] == runtime  # measured once
        at = snap.at_peak
        assert at is not None and snap.peak_bytes is not None
        assert sum(v or 0 for v in at.values()) == snap.peak_bytes  # the table adds up
        assert at[Component.RUNTIME.value] == runtime
        unattributed = snap.memory[Component.UNATTRIBUTED.value]
        assert unattributed is not None and unattributed < runtime / 4  # only what grew since
    assert history[0].memory[Component.UNATTRIBUTED.value] == 0  # the baseline's own step
