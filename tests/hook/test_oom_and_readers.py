"""Out-of-memory ends a run with a last-snapshot file; misbehaving readers never touch training."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import anatomy
from anatomy import protocol
from anatomy.vocabulary import Component

VOCAB = 2000
OOM_TEXT = "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total capacity)"


def _setup(hk: SimpleNamespace) -> tuple[torch.nn.Module, torch.optim.Optimizer, dict[str, torch.Tensor]]:
    model = hk.small_bert(vocab=VOCAB)
    batch = hk.bert_batch()
    batch["input_ids"] = batch["input_ids"] % VOCAB
    return model, torch.optim.AdamW(model.parameters()), batch


def _no_saved_tensor_hooks_left() -> bool:
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_oom_inside_step_writes_last_snapshot(hk: SimpleNamespace, runtime_dir: Path) -> None:
    model, opt, batch = _setup(hk)
    tracker = anatomy.track(model, opt, sample_every=0)
    hk.train_steps(model, opt, 2, tracker, batch=batch)
    error = torch.OutOfMemoryError(OOM_TEXT)
    with pytest.raises(torch.OutOfMemoryError) as caught, tracker.step():
        loss = model(**batch).loss
        loss.backward()
        raise error
    assert caught.value is error  # propagated unchanged
    path = protocol.oom_path(runtime_dir, os.getpid())
    assert path.exists()
    hello, snap = protocol.read_oom_file(path)
    assert hello.pid == os.getpid() and hello.optimizer == "adamw"
    assert snap.oom is not None and OOM_TEXT in snap.oom and "OutOfMemoryError" in snap.oom
    assert snap.step == 2  # the step that died
    assert snap.memory[Component.ACTIVATIONS.value]  # what it had measured before dying
    assert _no_saved_tensor_hooks_left()
    tracker.close()


def test_oom_raised_inside_forward_before_first_snapshot(hk: SimpleNamespace, runtime_dir: Path) -> None:
    model, opt, batch = _setup(hk)

    def explode(module: torch.nn.Module, args: object, output: object) -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 99 GB")

    model.bert.encoder.layer[1].register_forward_hook(explode)
    tracker = anatomy.track(model, opt, sample_every=0)
    with pytest.raises(RuntimeError, match="can't allocate memory"), tracker.step():
        model(**batch).loss.backward()
    assert _no_saved_tensor_hooks_left()  # the forward hook popped them although forward raised
    _, snap = protocol.read_oom_file(protocol.oom_path(runtime_dir, os.getpid()))
    assert snap.oom is not None and "can't allocate memory" in snap.oom
    assert snap.step == 0
    tracker.close()


def test_other_exceptions_write_no_oom_file(hk: SimpleNamespace, runtime_dir: Path) -> None:
    model, opt, batch = _setup(hk)
    tracker = anatomy.track(model, opt, sample_every=0)
    with pytest.raises(KeyError), tracker.step():
        model(**batch).loss.backward()
        raise KeyError("labels")
    assert not protocol.oom_path(runtime_dir, os.getpid()).exists()
    hk.train_steps(model, opt, 1, tracker, batch=batch)  # and training goes on being measured
    assert tracker.latest is not None and tracker.latest.step == 1
    tracker.close()


_KILLED_READER = """
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.recv(100)
print("connected", flush=True)
time.sleep(60)
"""


def test_misbehaving_readers_leave_training_untouched(hk: SimpleNamespace, runtime_dir: Path) -> None:
    model, opt, batch = _setup(hk)
    torch.manual_seed(5)
    reference, ref_opt, _ = _setup(hk)
    torch.manual_seed(7)
    ref_losses = hk.train_steps(reference, ref_opt, 6, batch=batch)

    torch.manual_seed(7)
    tracker = anatomy.track(model, opt, interval_s=0.005, sample_every=0)
    losses = hk.train_steps(model, opt, 1, tracker, batch=batch)
    path = tracker.socket_path
    assert path is not None
    # 1. connects and never reads (small receive buffer so the server's sends would block)
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(str(path))
    # 2. sends garbage
    garbage = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    garbage.connect(str(path))
    garbage.sendall(b"\x00\xff{not json}\n" * 1000)
    # 3. a reader process killed mid-run
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_READER, str(path)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"connected"
    good = protocol.Reader(path)
    try:
        for i in range(5):
            losses += hk.train_steps(model, opt, 1, tracker, batch=batch)
            if i == 1:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
            time.sleep(0.01)
        good.wait()
        deadline = time.monotonic() + 5
        while (good.snapshot is None or good.snapshot.step < 5) and time.monotonic() < deadline:
            good.poll()
            time.sleep(0.01)
        assert good.snapshot is not None and good.snapshot.step == 5
    finally:
        good.close()
        stuck.close()
        garbage.close()
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()
        tracker.close()
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(reference.parameters(), model.parameters(), strict=True))
    assert tracker.latest is not None and tracker.latest.error is None


def test_unusable_runtime_dir_degrades_to_unpublished(
    hk: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    monkeypatch.setenv("ANATOMY_TOP_DIR", str(blocker / "rt"))
    model, opt, batch = _setup(hk)
    with anatomy.track(model, opt, sample_every=0) as tracker:
        hk.train_steps(model, opt, 2, tracker, batch=batch)
        snap = tracker.latest
        assert tracker.socket_path is None
    assert snap is not None and snap.step == 1
    assert snap.memory[Component.ACTIVATIONS.value]  # still measured
    assert snap.error is not None and "publish" in snap.error
