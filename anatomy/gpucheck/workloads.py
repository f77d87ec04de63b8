"""The GPU check's training runs on ``cuda:0``, each run twice — without the hook, then with it — with the
independent counts taken in this process: tensor storages summed here (no anatomy code), the caching
allocator's readings, ``FlopCounterMode`` FLOPs, the wall clock around synchronized steps, NVML's figure for
this PID, and the monitor's ``--once --json`` in a subprocess while the hook is still publishing."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import anatomy
from anatomy.protocol import Hello, Snapshot, Timing

STEPS = 8
WARMUP = 2  # steps left out of the timing medians (allocator warm-up, kernel selection)
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Workload:
    name: str
    build: Callable[[], torch.nn.Module]
    batch: Callable[[int, torch.device], dict[str, torch.Tensor]]
    optimizer: Callable[[torch.nn.Module], Any]
    samples: int
    tokens: int | None
    monitor: bool = False  # run the monitor's --once --json during this workload
    steps: int = STEPS


@dataclass
class Run:
    """What one run measured: the user's readings, and with the hook its figures and the references."""

    user_peaks: list[int] = field(default_factory=list)  # max_memory_allocated per step (reset by the user)
    walls: list[float] = field(default_factory=list)  # synchronized wall time per step
    losses: list[float] = field(default_factory=list)
    gradients: int = 0  # storages of param.grad at the optimizer step, the largest seen
    activations: int = 0  # allocated growth across forward + loss (the last step)
    hook_resets: int = 0
    hook_peaks: list[int | None] = field(default_factory=list)
    hook_timings: list[Timing] = field(default_factory=list)  # the latest snapshot's, after each step
    snapshot: Snapshot | None = None
    hello: Hello | None = None
    weights: int = 0
    optimizer_states: int = 0  # state tensors in the allocator
    paged: int = 0  # state tensors in managed memory (bitsandbytes' is_paged)
    flops: float | None = None  # FLOPs of one step (FlopCounterMode)
    nvml: int | None = None
    monitor: dict[str, Any] | None = None
    monitor_error: str | None = None

    def phase(self, name: str) -> float | None:
        """The median over the steady steps of one of the hook's phase times (a sampled step, slowed by
        its profiler, is one of several)."""
        values = [x for t in self.hook_timings if (x := getattr(t, name)) is not None]
        return statistics.median(values) if values else None

    def wall(self) -> float | None:
        steady = self.walls[WARMUP:] or self.walls
        return statistics.median(steady) if steady else None


def storages(tensors: list[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def state_tensors(opt: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for st in opt.state.values():
        out.extend(v for v in st.values() if isinstance(v, torch.Tensor))
    return out


class ResetCounter:
    """Counts calls to ``torch.cuda.reset_peak_memory_stats`` other than the user's own (``user_reset``)."""

    def __init__(self) -> None:
        self.calls = 0
        self._original = torch.cuda.reset_peak_memory_stats

    def __enter__(self) -> ResetCounter:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return self._original(*args, **kwargs)

        torch.cuda.reset_peak_memory_stats = counted  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.reset_peak_memory_stats = self._original  # type: ignore[assignment]

    def user_reset(self, device: torch.device) -> None:
        self._original(device)


def nvml_process_bytes(pid: int) -> int | None:
    """NVML's used memory for ``pid``, the largest over the GPUs (as the monitor takes it)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        best: int | None = None
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                used = p.usedGpuMemory
                if p.pid == pid and isinstance(used, int):
                    best = used if best is None else max(best, used)
        return best
    finally:
        pynvml.nvmlShutdown()


def run_monitor(directory: Path) -> dict[str, Any]:
    """``anatomy-top --once --json`` in a subprocess, reading the hook's sockets in ``directory``."""
    env = dict(os.environ, ANATOMY_TOP_DIR=str(directory), PYTHONPATH=str(ROOT))
    code = "import sys; from tui.cli import main; sys.exit(main(['--once', '--json']))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"anatomy-top --once --json exited {out.returncode}: {out.stderr.strip()[:200]}")
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _step(
    model: torch.nn.Module, opt: Any, batch: dict[str, torch.Tensor], run: Run, dev: torch.device
) -> None:
    before = torch.cuda.memory_allocated(dev)
    loss = model(**batch).loss  # the output (logits) is dropped: what stays is what forward saved
    run.activations = torch.cuda.memory_allocated(dev) - before
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    run.losses.append(float(loss.detach().float().item()))


def train(work: Workload, hooked: bool, directory: Path, dev: torch.device) -> Run:
    torch.manual_seed(0)
    model = work.build().to(dev)
    model.train()
    opt = work.optimizer(model)
    run = Run()

    def grads(*_: Any) -> None:
        run.gradients = max(
            run.gradients, storages([p.grad for p in model.parameters() if p.grad is not None])
        )

    handle = opt.register_step_pre_hook(grads) if hasattr(opt, "register_step_pre_hook") else None
    tracker = (
        anatomy.track(model, opt, interval_s=0.0, sample_every=3, directory=directory) if hooked else None
    )
    try:
        with ResetCounter() as resets:
            for i in range(work.steps):
                batch = work.batch(i, dev)
                resets.user_reset(dev)  # the user resets the peak each step
                torch.cuda.synchronize(dev)
                t0 = time.perf_counter()
                ctx = (
                    tracker.step(samples=work.samples, tokens=work.tokens)
                    if tracker
                    else contextlib.nullcontext()
                )
                with ctx:
                    _step(model, opt, batch, run, dev)
                torch.cuda.synchronize(dev)
                run.walls.append(time.perf_counter() - t0)
                run.user_peaks.append(int(torch.cuda.max_memory_allocated(dev)))
                if tracker is not None:
                    snap = tracker.latest
                    run.hook_peaks.append(snap.peak_bytes if snap is not None else None)
                    if snap is not None and i >= WARMUP:
                        run.hook_timings.append(snap.timing)
            run.hook_resets = resets.calls
        if tracker is not None:
            run.snapshot, run.hello = tracker.latest, tracker.hello
            run.weights = storages([*model.parameters(), *model.buffers()])
            states = state_tensors(opt)
            run.paged = storages([t for t in states if getattr(t, "is_paged", False) is True])
            run.optimizer_states = storages([t for t in states if getattr(t, "is_paged", False) is not True])
            with contextlib.suppress(Exception):
                run.nvml = nvml_process_bytes(os.getpid())
            if work.monitor:
                try:
                    run.monitor = run_monitor(directory)
                except Exception as exc:
                    run.monitor_error = f"{type(exc).__name__}: {exc}"
        else:
            run.flops = count_flops(model, opt, work.batch(0, dev))
    finally:
        if tracker is not None:
            tracker.close()
        if handle is not None:
            handle.remove()
    return run


def release() -> None:
    """Between runs: the last run's model and optimizer are gone; give their cached blocks back."""
    import gc

    gc.collect()
    torch.cuda.empty_cache()


def count_flops(model: torch.nn.Module, opt: Any, batch: dict[str, torch.Tensor]) -> float:
    """FLOPs of one forward + backward (what MFU counts; the optimizer's element-wise work is not)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    opt.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


@contextlib.contextmanager
def publishing_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="anatomy-gpucheck-") as tmp:
        path = Path(tmp) / "run"
        path.mkdir(mode=0o700)
        yield path


# -- the workloads ----------------------------------------------------------------------------------------

LLAMA_BATCH, LLAMA_SEQ = 8, 512
BERT_BATCH, BERT_SEQ = 16, 256


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1376,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=LLAMA_SEQ,
        use_cache=False,
    )
    model: torch.nn.Module = LlamaForCausalLM(cfg)
    return model.to(torch.bfloat16)


def _llama_batch(i: int, dev: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(0, 32000, (LLAMA_BATCH, LLAMA_SEQ), generator=g).to(dev)
    return {"input_ids": ids, "labels": ids}


def _bert() -> torch.nn.Module:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        intermediate_size=2048,
        max_position_embeddings=BERT_SEQ,
    )
    return BertForMaskedLM(cfg)


def _bert_batch(i: int, dev: torch.device) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(0, 30522, (BERT_BATCH, BERT_SEQ), generator=g).to(dev)
    return {"input_ids": ids, "labels": ids}


def _adamw(model: torch.nn.Module) -> Any:
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def _paged_adamw_8bit(model: torch.nn.Module) -> Any:
    import bitsandbytes as bnb

    return bnb.optim.PagedAdamW8bit(model.parameters(), lr=1e-4)


WORKLOADS = (
    Workload("llama-bf16", _llama, _llama_batch, _adamw, LLAMA_BATCH, LLAMA_BATCH * LLAMA_SEQ, monitor=True),
    Workload("bert-fp32", _bert, _bert_batch, _adamw, BERT_BATCH, BERT_BATCH * BERT_SEQ),
    Workload("bert-paged-8bit", _bert, _bert_batch, _paged_adamw_8bit, BERT_BATCH, BERT_BATCH * BERT_SEQ),
)
