"""The hook's cost across model depth and step length, measured as a user would: whole processes.

Every configuration (a loop, a model, a depth, a width) runs three worker processes side by side:

- ``plain``: the training loop without the hook;
- ``control``: an identical second process without the hook (the A/A noise floor of this machine: every
  hook figure is printed next to the same figure for the control);
- ``hooked``: the same loop with the hook at default settings, publishing, a reader connected (a thread of
  this coordinating process, in the role of ``anatomy-top``: another process, like the monitor).

Interleaved rounds: the coordinator tells each worker in turn, over a pipe, to run one step (one step per arm
per round, in rotating order), so load from anything else on the machine hits all three alike; only one
worker computes at a time. Separate processes, not three models in one: the hook's garbage, its gc
collections, its publisher thread, its heap reads and its process-global state then fall on its own process
only, as in a user's job, and "GC collections per 1,000 steps" is a per-process count. Warm-up steps are
excluded from every figure but the first-step extras; torch runs on one thread (steadier on a shared box).
One thing this shape understates: the publisher thread's work (about two sends a second) can run while the
hooked worker waits for its turn, where in a real run it would take the GIL from training now and then — so
the whole process's CPU time, every thread, is printed too.

A step's time is what a user's own timer sees: from the worker's release to the point where the next step
would begin — around ``with tracker.step(samples=..., tokens=...)`` for the plain loop (told its batch as
README's loop is: its ordinary steps then leave the forward unwatched); for the Hugging Face Trainer and
Lightning, from one ``on_step_begin`` / ``on_train_batch_start`` (a callback placed before anatomy's) to the
next, so everything the loop and the callbacks do between steps is in it.

Printed per configuration, and as JSON with ``--json``:

- **extra per unsampled step**: median over rounds of (hooked − plain), on rounds whose hooked step ran no
  sampled instrument (the hooked worker reports the steps its schedule instrumented: the profiler, the
  trace, or a piece of either; a hook before the pieces by the old rule, step 1 and one in
  ``SAMPLE_EVERY``), with the interquartile range over rounds; beside it the same for the control; and the
  same in the training thread's CPU time (what the hook adds to the thread, without the waits for a CPU
  that a loaded machine adds to wall-clock times);
- **all-in**, two ways: *measured* — every measured step, sampled ones included, Σ hooked / Σ plain over
  the run (only as complete as the run is long); and *amortized* (the summary's figure) — Σ hooked /
  Σ plain over the unsampled rounds (so the work done once per publish interval and the gc it causes are
  in it), plus the sampled work spread over the steps: a profiling episode's extra time in all (its pieces
  over consecutive steps) and a tracing one's, one in ``TRACE_EVERY`` episodes, every ``SAMPLE_EVERY``
  steps — no more than the hook's time budget lets sampled steps spend (``BUDGET_FRACTION`` of the step less
  the cheap kinds' ``RESERVED_SHARE``). (Before
  the pieces: each sampled step's extra over ``SAMPLE_EVERY`` steps, a traced one's over
  ``SAMPLE_EVERY * TRACE_EVERY``; where the run has none, from step 1, an upper bound, marked ``<=``.)
- **the most any step was held up**, in usual steps: the largest (hooked − plain) of any step, warm-up
  included, over the median unsampled plain step;
- p99 and max step of each arm (measured steps, sampled ones included);
- first-step extras: step 0 (first sums, counts, heap reads) and step 1 (the op-group profiler and the per-op
  memory trace), hooked − plain;
- gc collections per 1,000 steps per generation (``gc.callbacks`` in each worker, over the measured span);
- the whole process's CPU time over the measured steps (every thread: the publisher's too), hooked / plain:
  an all-in ratio that a loaded machine hardly moves.

Usage:
  python benchmarks/bench_hook_sweep.py --quick                  # ~2 minutes
  python benchmarks/bench_hook_sweep.py --loops plain --depths 2,32,96 --json out.json
  python benchmarks/bench_hook_sweep.py --only llama --depths 8 --loops trainer,lightning --rounds 300
  python benchmarks/bench_hook_sweep.py --device cuda --loops plain --depths 2,8,32 --widths ""  # on a GPU
  python benchmarks/bench_hook_sweep.py --device cuda --loops plain --cpu 15   # every worker on CPU 15
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ARMS = ("plain", "control", "hooked")
LOOPS = ("plain", "trainer", "lightning")
MODELS = ("mlp", "llama")
DEFAULT_DEPTHS = (2, 8, 32, 96)
# Step length: the MLP's width (at batch MLP_BATCH) at the smallest depth — sub-millisecond to hundreds of ms.
DEFAULT_WIDTHS = (64, 512, 2048)
MLP_WIDTH = 64  # the depth sweep's width
MLP_BATCH = 64
LLAMA = {"hidden": 64, "intermediate": 256, "heads": 4, "vocab": 1024, "batch": 4, "seq": 32}
MAX_ROUNDS = 4000  # datasets for the Trainer and Lightning are sized for this many steps
READY_TIMEOUT_S = 600.0


def _budget_fraction() -> float:
    try:
        from anatomy.hook import schedule

        # (what sampled steps may spend of it: all but the cheap kinds' reserve)
        fraction = float(getattr(schedule, "BUDGET_FRACTION", 0.01))
        return fraction * (1 - float(getattr(schedule, "RESERVED_SHARE", 0.0)))
    except Exception:
        return 0.01


def _schedule_constants() -> tuple[int, int]:
    """The hook's default sampling periods (the ``cost`` work may change them; read, not copied)."""
    try:
        from anatomy.hook import schedule

        return int(schedule.SAMPLE_EVERY), int(getattr(schedule, "TRACE_EVERY", 5))
    except Exception:
        return 100, 5


@dataclass(frozen=True)
class Config:
    loop: str
    model: str
    depth: int
    width: int  # the MLP's width; the Llama's hidden size
    device: str = "cpu"

    @property
    def label(self) -> str:
        where = "" if self.device == "cpu" else f" on {self.device}"
        if self.model == "mlp":
            return f"{self.depth}-block MLP w{self.width}{where}"
        return f"tiny Llama, {self.depth} layers{where}"


# -- the worker process ------------------------------------------------------------------------------


class Gate:
    """The worker's side of the interleaving: ``arrive()`` at each point where a step would begin ends the
    previous step's timing, reports it, and waits for the coordinator's next word."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.index = 0
        self.t0: float | None = None
        self.c0 = 0.0
        self.stopped = False
        self.collections = [0, 0, 0]
        self.start: tuple[list[int], float] | None = None
        self.last: tuple[list[int], float] | None = None
        self.sampled: dict[int, str] = {}  # step -> the instrument it ran (hooked arm: _watch_sampled)
        # On a GPU a step ends when its kernels have run, as a user's timer around a synchronizing loss
        # read sees it; without this the host's launches alone would be timed.
        self.sync: Callable[[], None] | None = None
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.collections[info["generation"]] += 1

    def arrive(self) -> bool:
        if self.sync is not None:
            self.sync()
        now, cpu = time.perf_counter(), time.thread_time()
        if self.stopped:
            return False
        if self.t0 is None:
            self.conn.send(("ready",))
        else:
            self.last = (list(self.collections), time.process_time())
            kind = self.sampled.pop(self.index, "")
            self.conn.send(("step", self.index, now - self.t0, cpu - self.c0, kind))
            self.index += 1
        command = self.conn.recv()
        if command[0] == "stop":
            self.stopped = True
            return False
        if command[1]:  # the first measured step: the gc and process-CPU counts start here
            self.start = (list(self.collections), time.process_time())
        self.c0 = time.thread_time()
        self.t0 = time.perf_counter()
        return True

    def summary(self) -> dict[str, Any]:
        if self.start is None or self.last is None:
            return {"gc": [0, 0, 0], "process_cpu_s": 0.0}
        gcs = [b - a for a, b in zip(self.start[0], self.last[0], strict=True)]
        return {"gc": gcs, "process_cpu_s": self.last[1] - self.start[1]}


def _watch_sampled(gate: Gate) -> bool:
    """Which steps run a sampled instrument (the op-group profiler, the per-op trace, or a piece of
    either), as the hook's schedule decides them — it may hold one back for its time budget or run an
    episode of pieces over consecutive steps, so no fixed rule of step numbers says. A hook without
    ``_start_sampled`` (before the pieces) is classified by the old rule instead: False."""
    try:
        from anatomy.hook.sampled import SampledSteps
    except ImportError:
        return False
    original = SampledSteps._start_sampled

    def start(self: Any, rec: Any, kind: str) -> None:
        gate.sampled[rec.index] = kind
        original(self, rec, kind)

    SampledSteps._start_sampled = start  # type: ignore[method-assign]
    return True


def _build(config: Config) -> Any:
    import torch

    torch.manual_seed(0)  # identical weights in every arm
    if config.model == "mlp":
        blocks = [
            torch.nn.Sequential(
                torch.nn.Linear(config.width, config.width),
                torch.nn.ReLU(),
                torch.nn.Linear(config.width, config.width),
            )
            for _ in range(config.depth)
        ]
        return torch.nn.Sequential(*blocks)
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=LLAMA["vocab"],
        hidden_size=config.width,
        intermediate_size=LLAMA["intermediate"],
        num_hidden_layers=config.depth,
        num_attention_heads=LLAMA["heads"],
        num_key_value_heads=LLAMA["heads"],
        max_position_embeddings=LLAMA["seq"],
    )
    return LlamaForCausalLM(cfg)


def _sample(config: Config) -> dict[str, Any]:
    """One training sample (the Trainer's and Lightning's datasets repeat it; the plain loop's batch
    stacks it)."""
    import torch

    g = torch.Generator().manual_seed(1)
    if config.model == "mlp":
        return {"x": torch.randn(config.width, generator=g)}
    ids = torch.randint(0, LLAMA["vocab"], (LLAMA["seq"],), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def _batch_size(config: Config) -> int:
    return MLP_BATCH if config.model == "mlp" else LLAMA["batch"]


def _loss(net: Any, batch: dict[str, Any]) -> Any:
    if "x" in batch:
        return net(batch["x"]).square().mean()
    return net(input_ids=batch["input_ids"], labels=batch["labels"]).loss


class _Repeat:
    """A map-style dataset of one sample repeated (data loading is not what is measured)."""

    def __init__(self, sample: dict[str, Any], length: int) -> None:
        self.sample = sample
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.sample


def _plain_loop(config: Config, gate: Gate, hooked: bool) -> None:
    import torch

    model = _build(config).to(config.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sample = _sample(config)
    n = _batch_size(config)
    batch = {k: torch.stack([v] * n).to(config.device) for k, v in sample.items()}
    tracker = None
    if hooked:
        import anatomy

        tracker = anatomy.track(model, opt)
    # The step is told its samples and tokens, as README's loop tells it (then ordinary steps leave the
    # forward unwatched); a batch of floats has no tokens.
    tokens = int(batch["input_ids"].numel()) if "input_ids" in batch else None
    while gate.arrive():
        with tracker.step(samples=n, tokens=tokens) if tracker is not None else contextlib.nullcontext():
            _loss(model, batch).backward()
            opt.step()
            opt.zero_grad()
    if tracker is not None:
        tracker.close()


def _trainer_loop(config: Config, gate: Gate, hooked: bool, out_dir: str) -> None:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Net(torch.nn.Module):  # the Trainer wants a model that returns its loss
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, **batch: Any) -> dict[str, Any]:
            return {"loss": _loss(self.inner, batch)}

    class GateCallback(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not gate.arrive():
                control.should_training_stop = True  # this step runs (untimed); the loop ends after it

    model = _build(config)
    model = model if config.model == "llama" else Net(model)
    callbacks: list[Any] = [GateCallback()]
    if hooked:
        import anatomy

        callbacks.append(anatomy.AnatomyCallback())
    args = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=_batch_size(config),
        num_train_epochs=1,
        learning_rate=1e-3,
        optim="adamw_torch",
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        use_cpu=config.device == "cpu",
        dataloader_pin_memory=False,
        remove_unused_columns=False,
        seed=0,
    )
    dataset = _Repeat(_sample(config), _batch_size(config) * (MAX_ROUNDS + 64))
    trainer = Trainer(model=model, args=args, train_dataset=dataset, callbacks=callbacks)
    trainer.train()


def _lightning_loop(config: Config, gate: Gate, hooked: bool) -> None:
    import lightning.pytorch as pl
    import torch

    stopping = [False]

    class Module(pl.LightningModule):
        def __init__(self, net: torch.nn.Module) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            return _loss(self.net, batch)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

        def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
            return -1 if stopping[0] else None  # -1: the rest of the (only) epoch is skipped

    class GateCallback(pl.Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if not gate.arrive():
                stopping[0] = True

    callbacks: list[Any] = [GateCallback()]
    if hooked:
        from anatomy.lightning import AnatomyCallback

        callbacks.append(AnatomyCallback())
    dataset = _Repeat(_sample(config), _batch_size(config) * (MAX_ROUNDS + 64))
    loader: Any = torch.utils.data.DataLoader(dataset, batch_size=_batch_size(config))  # type: ignore[arg-type]
    trainer = pl.Trainer(
        accelerator="cpu" if config.device == "cpu" else "gpu",
        devices=1,
        max_epochs=1,
        callbacks=callbacks,
        enable_progress_bar=False,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(Module(_build(config)), loader)


def worker(
    conn: Connection, config: Config, arm: str, directory: str, threads: int, cpu: int | None = None
) -> None:
    """One arm's process: build, then step only when told (``cpu``: on that one CPU, every thread of it)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    hooked = arm == "hooked"
    if hooked:
        os.environ["ANATOMY_TOP_DIR"] = directory
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # Lightning's and the Trainer's start-up advice, not results
    import torch

    torch.set_num_threads(threads)
    # A forked child shares the server's pages until it writes them, and a full collection writes every
    # object's gc header: the first one in a measured step would copy the whole inherited heap (~1 s seen)
    # where a freshly started process pays nothing of the kind. Pay it here, before anything is timed.
    gc.collect()
    gate = Gate(conn)
    if config.device.startswith("cuda"):
        gate.sync = torch.cuda.synchronize
    watched = hooked and _watch_sampled(gate)
    try:
        # the frameworks' own prints (the Trainer's final metrics) stay out of the benchmark's output
        with (
            tempfile.TemporaryDirectory() as out_dir,
            open(os.devnull, "w") as null,
            contextlib.redirect_stdout(null),
        ):
            if config.loop == "plain":
                _plain_loop(config, gate, hooked)
            elif config.loop == "trainer":
                _trainer_loop(config, gate, hooked, out_dir)
            else:
                _lightning_loop(config, gate, hooked)
        conn.send(("done", {**gate.summary(), "watched": watched}))
    except BaseException as exc:  # tell the coordinator instead of leaving it waiting
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


# -- the coordinator ---------------------------------------------------------------------------------


class ReaderThread:
    """A monitor's reader: connects when the hooked worker's socket appears and drains it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.stop = threading.Event()
        self.connected = threading.Event()
        self.received = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        from anatomy import protocol

        reader = None
        while reader is None and not self.stop.is_set():
            found = protocol.discover(self.directory)
            if found:
                with contextlib.suppress(OSError):
                    reader = protocol.Reader(found[0])
            if reader is None:
                time.sleep(0.01)
        if reader is None:
            return
        self.connected.set()
        with reader:
            while not self.stop.is_set() and not reader.closed:
                if reader.poll() and reader.snapshot is not None:
                    self.received += 1
                time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


_CONTEXT: Any = None


def _context(preload: Sequence[str] = ()) -> Any:
    """Workers fork from a server that imported torch and the frameworks once: still a fresh process per arm
    (its own heap, gc, threads; the same modules loaded in every arm), without paying the imports three times
    per configuration on a small machine."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(["__main__", "torch", *preload])
    return _CONTEXT


def preloads(args: argparse.Namespace) -> list[str]:
    names = []
    if "llama" in args.only:
        names.append("transformers.models.llama.modeling_llama")
    if "trainer" in args.loops:
        names.append("transformers.trainer")
    if "lightning" in args.loops:
        names.append("lightning.pytorch")
    return names


class Arms:
    """The three worker processes of one configuration."""

    def __init__(self, config: Config, directory: Path, threads: int, cpu: int | None = None) -> None:
        ctx = _context()
        self.conns: dict[str, Connection] = {}
        self.procs: dict[str, Any] = {}
        for arm in ARMS:
            parent, child = ctx.Pipe()
            args = (child, config, arm, str(directory), threads, cpu)
            proc = ctx.Process(target=worker, args=args, daemon=True)
            proc.start()
            child.close()
            self.conns[arm], self.procs[arm] = parent, proc
        for arm in ARMS:
            self._expect(arm, "ready")

    def _expect(self, arm: str, kind: str) -> tuple[Any, ...]:
        conn = self.conns[arm]
        if not conn.poll(READY_TIMEOUT_S):
            raise RuntimeError(f"the {arm} worker did not answer within {READY_TIMEOUT_S:.0f} s")
        try:
            message: tuple[Any, ...] = conn.recv()
        except EOFError:
            raise RuntimeError(f"the {arm} worker exited (code {self.procs[arm].exitcode})") from None
        if message[0] == "error":
            raise RuntimeError(f"the {arm} worker failed: {message[1]}")
        if message[0] != kind:
            raise RuntimeError(f"the {arm} worker said {message[0]!r}, expected {kind!r}")
        return message

    def step(self, arm: str, mark: bool) -> tuple[int, float, float, str]:
        self.conns[arm].send(("go", mark))
        _, index, wall, cpu, kind = self._expect(arm, "step")
        return int(index), float(wall), float(cpu), str(kind)

    def finish(self) -> dict[str, dict[str, Any]]:
        summaries = {}
        for arm in ARMS:
            self.conns[arm].send(("stop",))
        for arm in ARMS:
            summaries[arm] = self._expect(arm, "done")[1]
        self.close()
        return summaries

    def close(self) -> None:
        for arm, proc in self.procs.items():
            proc.join(timeout=30)
            if proc.is_alive():  # our own worker, by its handle
                proc.terminate()
                proc.join(timeout=5)
            self.conns[arm].close()


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


def _iqr(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        v = values[0] if values else math.nan
        return v, v
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def _ratio_of_sums(num: Sequence[float], den: Sequence[float]) -> float:
    total = sum(den)
    return sum(num) / total if total > 0 else math.nan


def run_config(config: Config, args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    sample_every, trace_every = _schedule_constants()

    def sampled(i: int) -> bool:
        return sample_every > 0 and (i == 1 or (i > 0 and i % sample_every == 0))

    def traced(i: int) -> bool:
        return sample_every > 0 and (i == 1 or (i > 0 and i % (sample_every * trace_every) == 0))

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="anatomy-sweep-") as tmp:
        directory = Path(tmp)
        arms = Arms(config, directory, args.threads, args.cpu)
        startup = time.perf_counter() - started
        reader = ReaderThread(directory)
        try:
            warm: dict[str, list[float]] = {arm: [] for arm in ARMS}
            warm_kinds: list[str] = []
            order = list(ARMS)
            r = 0
            for _ in range(args.warmup):
                for arm in order[r % 3 :] + order[: r % 3]:
                    got = arms.step(arm, False)
                    warm[arm].append(got[1])
                    if arm == "hooked":
                        warm_kinds.append(got[3])
                r += 1
            reader.connected.wait(5.0)  # measured steps run with the reader connected
            rounds = args.rounds
            if not rounds:  # as many as the time budget allows, at least enough to reach a sampled step
                recent = warm["plain"][2:] or warm["plain"]
                step_s = statistics.median(recent) if recent else 0.01
                fit = int(args.budget / max(3 * step_s, 1e-6))
                least = max(1, sample_every - args.warmup + 5)
                rounds = max(least, min(MAX_ROUNDS, fit))
            rounds = min(rounds, MAX_ROUNDS)
            times: dict[str, list[float]] = {arm: [] for arm in ARMS}
            cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
            indices: list[int] = []
            kinds: list[str] = []
            for k in range(rounds):
                this: dict[str, tuple[int, float, float, str]] = {}
                for arm in order[r % 3 :] + order[: r % 3]:
                    this[arm] = arms.step(arm, k == 0)
                r += 1
                indices.append(this["hooked"][0])
                kinds.append(this["hooked"][3])
                for arm in ARMS:
                    times[arm].append(this[arm][1])
                    cpu[arm].append(this[arm][2])
            summaries = arms.finish()
        except BaseException:
            arms.close()
            raise
        finally:
            reader.close()
    elapsed = time.perf_counter() - started

    plain, control, hooked = times["plain"], times["control"], times["hooked"]
    watched = bool(summaries["hooked"].get("watched"))
    if watched:  # the steps the hook's schedule instrumented, as it ran them
        unsampled = [k for k, kind in enumerate(kinds) if not kind]
        sampled_only = [k for k, kind in enumerate(kinds) if kind == "profile"]
        traced_k = [k for k, kind in enumerate(kinds) if kind == "trace"]
    else:  # a hook without pieces: step 1 and one in sample_every (one in TRACE_EVERY of them traced)
        unsampled = [k for k, i in enumerate(indices) if not sampled(i)]
        sampled_only = [k for k, i in enumerate(indices) if sampled(i) and not traced(i)]
        traced_k = [k for k, i in enumerate(indices) if traced(i)]

    def diffs(arm: str, ks: Sequence[int]) -> list[float]:
        return [times[arm][k] - plain[k] for k in ks]

    extra = diffs("hooked", unsampled)
    noise = diffs("control", unsampled)
    # The training thread's CPU time: what the hook adds to the thread, without the waits for a CPU that a
    # loaded machine puts into wall-clock times (a far steadier figure on a shared box).
    extra_cpu = [cpu["hooked"][k] - cpu["plain"][k] for k in unsampled]
    noise_cpu = [cpu["control"][k] - cpu["plain"][k] for k in unsampled]
    first = {
        f"step{i}_extra_ms": (warm["hooked"][i] - warm["plain"][i]) * 1e3
        if len(warm["plain"]) > i
        else math.nan
        for i in (0, 1)
    }
    step1_extra = first["step1_extra_ms"] / 1e3
    upper = False
    if sampled_only:
        sampled_extra = statistics.median(diffs("hooked", sampled_only))
    else:
        sampled_extra, upper = step1_extra, True
    if traced_k:
        traced_extra = statistics.median(diffs("hooked", traced_k))
    else:
        traced_extra, upper = step1_extra, True
    if math.isnan(sampled_extra) or math.isnan(traced_extra) or sample_every <= 0:
        sampled_extra = traced_extra = 0.0
    plain_unsampled = [plain[k] for k in unsampled]
    mean_plain = statistics.fmean(plain_unsampled) if plain_unsampled else math.nan
    per_step_sampling = (
        sampled_extra * (1 / sample_every - 1 / (sample_every * trace_every))
        + traced_extra / (sample_every * trace_every)
        if sample_every > 0
        else 0.0
    )
    # Every step's extra time, warm-up included, over the usual step: the most any step was held up.
    every_extra = [h - p for h, p in zip(warm["hooked"] + hooked, warm["plain"] + plain, strict=True)]
    usual = statistics.median(plain_unsampled) if plain_unsampled else math.nan
    worst = max(range(len(every_extra)), key=lambda i: every_extra[i]) if every_extra else 0
    episodes: dict[str, list[float]] = {}
    if watched:
        # A sampled episode is a run of steps of one instrument (a piece a step); what one costs in all,
        # spread over the steps between episodes: one in sample_every at most, and no more often than
        # the hook's time budget lets what they cost through.
        every_kind = warm_kinds + kinds
        for i, kind in enumerate(every_kind):
            if kind:
                if i == 0 or every_kind[i - 1] != kind:
                    episodes.setdefault(kind, []).append(0.0)
                episodes[kind][-1] += every_extra[i]
        profile_cost = statistics.fmean(episodes.get("profile", [0.0]))
        trace_cost = statistics.fmean(episodes.get("trace", [0.0]))
        sampled_extra, traced_extra, upper = profile_cost, trace_cost, False
        per_episode = profile_cost + trace_cost / trace_every
        budget = _budget_fraction()
        per_step_sampling = (
            min(per_episode / sample_every, budget * mean_plain) if sample_every > 0 else 0.0
        )
    all_in_amortized = (
        _ratio_of_sums([hooked[k] for k in unsampled], plain_unsampled) + per_step_sampling / mean_plain
    )
    n = len(plain)

    def arm_stats(arm: str) -> dict[str, Any]:
        summary = summaries[arm]
        return {
            "median_ms": statistics.median(times[arm]) * 1e3,
            "p99_ms": _quantile(times[arm], 0.99) * 1e3,
            "max_ms": max(times[arm]) * 1e3,
            "gc_per_1000": [c * 1000 / n for c in summary["gc"]],
            "process_cpu_s": summary["process_cpu_s"],
            "thread_cpu_median_ms": statistics.median(cpu[arm]) * 1e3,
        }

    stats = {arm: arm_stats(arm) for arm in ARMS}
    pcpu = stats["plain"]["process_cpu_s"]
    result: dict[str, Any] = {
        "config": asdict(config),
        "label": config.label,
        "rounds": n,
        "warmup": args.warmup,
        "threads": args.threads,
        "cpu": args.cpu,
        "seconds": elapsed,
        "startup_s": startup,
        "snapshots_received": reader.received,
        "sample_every": sample_every,
        "trace_every": trace_every,
        "sampled_steps_in_run": len(sampled_only) + len(traced_k),
        "traced_steps_in_run": len(traced_k),
        "step_ms": statistics.median(plain) * 1e3,
        "extra_unsampled_us": statistics.median(extra) * 1e6 if extra else math.nan,
        "extra_unsampled_iqr_us": [v * 1e6 for v in _iqr(extra)],
        "control_unsampled_us": statistics.median(noise) * 1e6 if noise else math.nan,
        "control_unsampled_iqr_us": [v * 1e6 for v in _iqr(noise)],
        "extra_unsampled_cpu_us": statistics.median(extra_cpu) * 1e6 if extra_cpu else math.nan,
        "extra_unsampled_cpu_iqr_us": [v * 1e6 for v in _iqr(extra_cpu)],
        "control_unsampled_cpu_us": statistics.median(noise_cpu) * 1e6 if noise_cpu else math.nan,
        "all_in_amortized": all_in_amortized,
        "all_in_amortized_upper_bound": upper,
        "control_all_in_amortized": _ratio_of_sums([control[k] for k in unsampled], plain_unsampled),
        "all_in_measured": _ratio_of_sums(hooked, plain),
        "control_all_in_measured": _ratio_of_sums(control, plain),
        "sampled_extra_ms": sampled_extra * 1e3,
        "traced_extra_ms": traced_extra * 1e3,
        **first,
        "max_delay_steps": every_extra[worst] / usual if every_extra and usual > 0 else math.nan,
        "max_delay_step": worst,
        "sampled_by_schedule": watched,
        "episodes": {kind: len(costs) for kind, costs in episodes.items()},
        "process_cpu_ratio": stats["hooked"]["process_cpu_s"] / pcpu if pcpu > 0 else math.nan,
        "control_process_cpu_ratio": stats["control"]["process_cpu_s"] / pcpu if pcpu > 0 else math.nan,
        "arms": stats,
    }
    _print_config(result, log)
    return result


def _fmt_gc(values: Sequence[float]) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def _print_config(res: dict[str, Any], log: Callable[[str], None]) -> None:
    a = res["arms"]
    lo, hi = res["extra_unsampled_iqr_us"]
    clo, chi = res["control_unsampled_iqr_us"]
    bound = "<=" if res["all_in_amortized_upper_bound"] else ""
    log(
        f"[{res['config']['loop']}] {res['label']}: {res['rounds']} rounds "
        f"({res['warmup']} warm-up excluded), "
        f"{res['seconds']:.1f} s ({res['startup_s']:.1f} s start-up), "
        f"reader got {res['snapshots_received']} snapshots"
    )
    log("  step median      : " + " | ".join(f"{arm} {a[arm]['median_ms']:.3f} ms" for arm in ARMS))
    log(
        f"  unsampled CPU    : training thread {res['extra_unsampled_cpu_us']:+.1f} µs "
        f"(IQR {res['extra_unsampled_cpu_iqr_us'][0]:+.1f}..{res['extra_unsampled_cpu_iqr_us'][1]:+.1f}, "
        f"A/A {res['control_unsampled_cpu_us']:+.1f} µs)"
    )
    log(
        f"  unsampled extra  : wall {res['extra_unsampled_us']:+.1f} µs (IQR {lo:+.1f}..{hi:+.1f})   "
        f"A/A {res['control_unsampled_us']:+.1f} µs (IQR {clo:+.1f}..{chi:+.1f})"
    )
    log(
        f"  all-in amortized : {bound}{res['all_in_amortized']:.4f}x "
        f"(A/A {res['control_all_in_amortized']:.4f}x); "
        + (
            f"a profiling episode +{res['sampled_extra_ms']:.2f} ms, a tracing one "
            f"+{res['traced_extra_ms']:.2f} ms (in all), at the rate the schedule and its budget allow"
            if res["sampled_by_schedule"]
            else f"sampled step +{res['sampled_extra_ms']:.2f} ms per {res['sample_every']}, "
            f"traced +{res['traced_extra_ms']:.2f} ms per {res['sample_every'] * res['trace_every']}"
        )
    )
    log(
        f"  all-in measured  : {res['all_in_measured']:.4f}x (A/A {res['control_all_in_measured']:.4f}x) "
        f"over {res['rounds']} steps incl. {res['sampled_steps_in_run']} sampled, "
        f"{res['traced_steps_in_run']} traced"
    )
    log(
        "  p99 / max step   : "
        + " | ".join(f"{arm} {a[arm]['p99_ms']:.3f} / {a[arm]['max_ms']:.3f} ms" for arm in ARMS)
    )
    log(
        f"  first steps extra: step 0 {res['step0_extra_ms']:+.2f} ms, step 1 (the first sampled) "
        f"{res['step1_extra_ms']:+.2f} ms; the most any step was held up: "
        f"{res['max_delay_steps']:.2f} usual steps (step {res['max_delay_step']})"
    )
    log(
        "  gc per 1000 steps (gen 0/1/2): "
        + " | ".join(f"{arm} {_fmt_gc(a[arm]['gc_per_1000'])}" for arm in ARMS)
    )
    log(
        f"  process CPU      : hooked/plain {res['process_cpu_ratio']:.4f}x "
        f"(A/A {res['control_process_cpu_ratio']:.4f}x)"
    )


SUMMARY_COLUMNS = (
    "loop",
    "model",
    "step",
    "extra per unsampled step",
    "A/A",
    "extra, thread CPU",
    "A/A CPU",
    "all-in",
    "A/A all-in",
    "all-in measured",
    "all-in process CPU",
    "A/A process CPU",
    "p99 hooked/plain",
    "max hooked/plain",
    "first-step extra",
    "max delay (steps)",
    "gc/1k hooked",
    "gc/1k plain",
)


def summary_table(results: Sequence[dict[str, Any]]) -> list[str]:
    """The issue's table (model, step, extra per unsampled step, all-in), A/A and the rest beside it."""
    lines = ["| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for res in results:
        a = res["arms"]
        lo, hi = res["extra_unsampled_iqr_us"]
        bound = "<=" if res["all_in_amortized_upper_bound"] else ""
        cells = [
            res["config"]["loop"],
            res["label"],
            f"{res['step_ms']:.2f} ms",
            f"{res['extra_unsampled_us']:+.0f} µs ({lo:+.0f}..{hi:+.0f})",
            f"{res['control_unsampled_us']:+.0f} µs",
            f"{res['extra_unsampled_cpu_us']:+.0f} µs",
            f"{res['control_unsampled_cpu_us']:+.0f} µs",
            f"{bound}{res['all_in_amortized']:.3f}x",
            f"{res['control_all_in_amortized']:.3f}x",
            f"{res['all_in_measured']:.3f}x",
            f"{res['process_cpu_ratio']:.3f}x",
            f"{res['control_process_cpu_ratio']:.3f}x",
            f"{a['hooked']['p99_ms']:.2f}/{a['plain']['p99_ms']:.2f} ms",
            f"{a['hooked']['max_ms']:.2f}/{a['plain']['max_ms']:.2f} ms",
            f"{res['step1_extra_ms']:+.1f} ms",
            f"{res['max_delay_steps']:.2f}",
            _fmt_gc(a["hooked"]["gc_per_1000"]),
            _fmt_gc(a["plain"]["gc_per_1000"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def configs(args: argparse.Namespace) -> Iterator[Config]:
    for loop in args.loops:
        # --quick: the frameworks at the smallest depth only (their start-up is most of their time)
        depths = args.depths if loop == "plain" or not args.quick else [min(args.depths)]
        for model in args.only:
            if model == "mlp":
                seen = set()
                for depth in depths:
                    seen.add((depth, MLP_WIDTH))
                    yield Config(loop, "mlp", depth, MLP_WIDTH, args.device)
                if loop == "plain":  # step length: the width at the smallest depth
                    for width in args.widths:
                        if (min(args.depths), width) not in seen:
                            yield Config(loop, "mlp", min(args.depths), width, args.device)
            else:
                for depth in depths:
                    yield Config(loop, "llama", depth, LLAMA["hidden"], args.device)


def _csv(kind: Callable[[str], Any], choices: Sequence[Any] | None = None) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        if choices is not None:
            bad = [v for v in values if v not in choices]
            if bad:
                raise argparse.ArgumentTypeError(f"{bad} not in {list(choices)}")
        return values

    return parse


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--only", type=_csv(str, MODELS), default=list(MODELS), help="models: mlp,llama")
    ap.add_argument("--depths", type=_csv(int), default=None, help="blocks / layers (default 2,8,32,96)")
    ap.add_argument(
        "--widths",
        type=_csv(int),
        default=None,
        help="MLP widths at the smallest depth (step length; plain loop)",
    )
    ap.add_argument("--loops", type=_csv(str, LOOPS), default=list(LOOPS), help="plain,trainer,lightning")
    ap.add_argument(
        "--rounds", type=int, default=0, help="measured rounds per configuration (0: from --budget)"
    )
    ap.add_argument("--budget", type=float, default=None, help="seconds of measured rounds per configuration")
    ap.add_argument(
        "--warmup", type=int, default=5, help="rounds excluded (steps 0 and 1 give the first-step extras)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="every worker on this one CPU (steadier on many cores; default: where the scheduler puts them)",
    )
    ap.add_argument(
        "--device", default="cpu", help="where the model trains: cpu, or cuda (a step then ends synchronized)"
    )
    ap.add_argument("--quick", action="store_true", help="depths 2,8, a short budget: about 2 minutes")
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = ap.parse_args(argv)
    if args.quick:
        args.depths = args.depths or [2, 8]
        args.widths = args.widths if args.widths is not None else [512]
        args.budget = args.budget if args.budget is not None else 3.0
    args.depths = args.depths or list(DEFAULT_DEPTHS)
    args.widths = args.widths if args.widths is not None else list(DEFAULT_WIDTHS)
    args.budget = args.budget if args.budget is not None else 60.0
    args.warmup = max(args.warmup, 2)  # steps 0 and 1 are the first-step extras
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)

    def log(line: str) -> None:
        print(line, flush=True)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    log(
        f"hook sweep: loops {','.join(args.loops)}, models {','.join(args.only)}, depths "
        f"{','.join(map(str, args.depths))}; {args.threads} torch thread(s) per worker"
        f"{'' if args.cpu is None else f', all on CPU {args.cpu}'}; "
        f"load average {load:.2f} "
        f"on {os.cpu_count()} CPUs"
    )
    results = []
    _context(preloads(args))
    for config in configs(args):
        try:
            results.append(run_config(config, args, log))
        except RuntimeError as exc:
            log(f"[{config.loop}] {config.label}: not measured ({exc})")
    log("")
    log("summary (all-in: amortized, see the docstring; <= marks an upper bound from step 1's cost)")
    for line in summary_table(results):
        log(line)
    if args.json is not None:
        payload = {"argv": sys.argv[1:], "load_average": load, "results": results}
        args.json.write_text(json.dumps(payload, indent=1))
        log(f"wrote {args.json}")


if __name__ == "__main__":
    main()
