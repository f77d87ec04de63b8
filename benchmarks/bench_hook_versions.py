"""Before and after, in one run: the hook at a git revision against the working tree's, per ordinary step.

Four worker processes per configuration, one step each per round in rotating order: ``plain`` (no hook),
``control`` (no hook again: the A/A noise floor), ``base`` (the hook as ``--base`` had it, from ``git
archive``) and ``this`` (the working tree's); with ``--floor`` a fifth, ``floor``: hooks of the kinds the hook
registers (forward pre with kwargs, forward post always called, the global optimizer step pre-hook, the
optimizer's post-hook, a step context; in Lightning and in the Hugging Face Trainer a callback with the
anatomy callback's per-batch methods and those hooks), each doing nothing — torch's dispatch and the calls
themselves, what no hook's code can take away — and ``this − floor`` per round, what the hook's own code adds.
Each times its step in the training thread's CPU time (what the hook adds to the thread; a loaded machine's
preemptions do not inflate it), with the hook at default settings and publishing, sampled steps off
(``sample_every`` past the run), so what is compared is the ordinary step. Printed per configuration: each
arm's median step, its extra over ``plain`` (median of per-round differences, interquartile range, mean of the
middle 80%), and ``this − base`` per round, the figure a change to the hook's per-step path is judged by.
Separate processes interleaved, because the machine's speed drifts by tens of percent between runs of a few
minutes on a shared box: only figures of the same run compare. With ``--device cuda`` each round starts from
an idle GPU and the wall time to the device's end of the step is printed too (a launch-bound step waits for
every µs the host adds).

Usage:
  python benchmarks/bench_hook_versions.py --base HEAD~1                 # MLP 2 and 8 blocks, ~2 minutes
  python benchmarks/bench_hook_versions.py --base 3c31d3b --models mlp,llama --depths 2,8,32 --rounds 1000
  python benchmarks/bench_hook_versions.py --base-dir /tmp/base --device cuda      # on a GPU: wall time too
  python benchmarks/bench_hook_versions.py --floor     # also hooks of the same kinds that do nothing
  python benchmarks/bench_hook_versions.py --told      # steps told their samples and tokens (README's loop)
  python benchmarks/bench_hook_versions.py --models trainer,lightning --floor   # the frameworks' callbacks
  python benchmarks/bench_hook_versions.py --told --fused  # under torch's fused AdamW (the Trainer's default)
  python benchmarks/bench_hook_versions.py --told --bnb --models mlp,trainer  # bitsandbytes' 8-bit AdamW
  python benchmarks/bench_hook_versions.py --told --accumulate 4 --models mlp,trainer,lightning  # 4 a step
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("plain", "control", "base", "this")
FLOOR = "floor"  # --floor: the same hooks doing nothing (torch's dispatch, the calls themselves)

# One arm in Lightning: a fit whose batches come one per line on stdin (Lightning fetches one batch ahead:
# the driver sends one line more at the start); a callback first in the list and one last time each step,
# from the batch's start to its end (the anatomy callback's calls between them).
LIGHTNING_WORKER = r"""
import sys, tempfile, time
from pathlib import Path
src, depth, threads, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[4]), sys.argv[5]
accumulate = int(sys.argv[8])  # batches a step (accumulate_grad_batches): one line brings them all
if src not in ("-", "floor"):
    sys.path.insert(0, src)
import logging
import torch
import lightning.pytorch as pl
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
torch.set_num_threads(threads)
torch.manual_seed(0)
class Module(pl.LightningModule):
    def __init__(self):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers)
    def forward(self, x):
        return self.net(x)
    def training_step(self, batch, i):
        return self(batch).sum()
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
x = torch.randn(4, 64)
class Batches(torch.utils.data.IterableDataset):
    def __iter__(self):
        for _ in sys.stdin:
            for _ in range(accumulate):
                yield x
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
class Start(pl.Callback):
    def on_train_batch_start(self, trainer, module, batch, i):
        if i % accumulate == 0:  # (a step's first batch)
            sync()  # (each step from an idle device, as the other workers' rounds)
            self.began = time.thread_time_ns(), time.perf_counter_ns()
class End(pl.Callback):
    def __init__(self, start):
        self.start = start
    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        if (i + 1) % accumulate == 0:  # (a step's last batch: its update done)
            sync()
            cpu, wall = self.start.began
            print((time.thread_time_ns() - cpu) / 1e3, (time.perf_counter_ns() - wall) / 1e3, flush=True)
start = Start()
callbacks = [start]
if src == "floor":  # the callback's calls and the hooks it registers, doing nothing
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    def nothing(*args):
        return None
    class Floor(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            pl_module.register_forward_pre_hook(nothing, with_kwargs=True)
            pl_module.register_forward_hook(nothing, always_call=True)
            register_optimizer_step_pre_hook(nothing)
            for opt in trainer.optimizers:
                opt.register_step_post_hook(nothing)
        def on_train_batch_start(self, *args):
            pass
        def on_before_backward(self, *args):
            pass
        def on_after_backward(self, *args):
            pass
        def on_before_optimizer_step(self, *args):
            pass
        def on_train_batch_end(self, *args):
            pass
    callbacks.append(Floor())
elif src != "-":
    import anatomy
    from anatomy.lightning import AnatomyCallback
    if not anatomy.__file__.startswith(src):
        raise SystemExit(f"anatomy came from {anatomy.__file__}, not {src}")
    callbacks.append(AnatomyCallback(directory=Path(tempfile.mkdtemp()), sample_every=10**9))
callbacks.append(End(start))
accelerator = "gpu" if device == "cuda" else "cpu"
trainer = pl.Trainer(max_epochs=1, accelerator=accelerator, devices=1, enable_progress_bar=False,
                     logger=False, enable_model_summary=False, enable_checkpointing=False,
                     callbacks=callbacks, default_root_dir=tempfile.mkdtemp(),
                     accumulate_grad_batches=accumulate)
print("ready", flush=True)
trainer.fit(Module(), torch.utils.data.DataLoader(Batches(), batch_size=None))
"""

# One arm in the Hugging Face Trainer: a run whose batches come one per line on stdin (accelerate's loader
# fetches one batch ahead: the driver sends one line more at the start), with the Trainer's defaults (its
# fused AdamW, gradient clipping, a linear schedule); a callback first in the list and one last time each step
# from on_step_begin to on_step_end (the anatomy callback's calls and its wrapped training_step between).
TRAINER_WORKER = r"""
import os, sys, tempfile, time, warnings
from pathlib import Path
src, depth, threads, device = sys.argv[1], int(sys.argv[2]), int(sys.argv[4]), sys.argv[5]
accumulate = int(sys.argv[8])  # micro-batches a step (gradient_accumulation_steps)
optim = {"optim": "paged_adamw_8bit"} if sys.argv[7] == "bnb" else {}  # (else the Trainer's default)
if src not in ("-", "floor"):
    sys.path.insert(0, src)
import torch
warnings.filterwarnings("ignore")
import transformers
from transformers import Trainer, TrainerCallback, TrainingArguments
transformers.logging.set_verbosity_error()
torch.set_num_threads(threads)
torch.manual_seed(0)
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*layers)
    def forward(self, x, labels=None):
        return {"loss": self.net(x).sum()}
x = torch.randn(64)
class Batches(torch.utils.data.IterableDataset):
    def __iter__(self):
        for _ in sys.stdin:
            for _ in range(4 * accumulate):
                yield {"x": x}
        os._exit(0)  # (stdin closed: the run is over; a Trainer of max_steps would start its epoch anew)
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
class Start(TrainerCallback):
    def on_step_begin(self, *args, **kwargs):
        sync()  # (each step from an idle device, as the other workers' rounds)
        self.began = time.thread_time_ns(), time.perf_counter_ns()
class End(TrainerCallback):
    def __init__(self, start):
        self.start = start
    def on_step_end(self, *args, **kwargs):
        sync()
        cpu, wall = self.start.began
        print((time.thread_time_ns() - cpu) / 1e3, (time.perf_counter_ns() - wall) / 1e3, flush=True)
start = Start()
callbacks = [start]
model = Model()
if src == "floor":  # the callback's calls and the hooks the anatomy callback registers, doing nothing
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    def nothing(*args):
        return None
    class Floor(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            model.register_forward_pre_hook(nothing, with_kwargs=True)
            model.register_forward_hook(nothing, always_call=True)
            register_optimizer_step_pre_hook(nothing)
            getattr(optimizer, "optimizer", optimizer).register_step_post_hook(nothing)  # (accelerate's)
        def on_step_begin(self, *args, **kwargs):
            pass
        def on_pre_optimizer_step(self, *args, **kwargs):
            pass
        def on_optimizer_step(self, *args, **kwargs):
            pass
        def on_substep_end(self, *args, **kwargs):
            pass
        def on_step_end(self, *args, **kwargs):
            pass
    callbacks.append(Floor())
elif src != "-":
    import anatomy
    if not anatomy.__file__.startswith(src):
        raise SystemExit(f"anatomy came from {anatomy.__file__}, not {src}")
    ours = anatomy.AnatomyCallback(directory=Path(tempfile.mkdtemp()), sample_every=10**9, log=False)
    callbacks.append(ours)
callbacks.append(End(start))
out = tempfile.mkdtemp()
args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=10**9, report_to="none",
                         use_cpu=device == "cpu", save_strategy="no", logging_strategy="no",
                         disable_tqdm=True, dataloader_num_workers=0, gradient_accumulation_steps=accumulate,
                         **optim)
trainer = Trainer(model=model, args=args, train_dataset=Batches(), callbacks=callbacks)
print("ready", flush=True)
trainer.train()
"""

# One arm: builds the model, then runs a step for each line on stdin and answers its CPU time in µs.
WORKER = r"""
import sys, tempfile, time
from pathlib import Path
src, depth, kind, threads, device = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
told = sys.argv[6] == "told"
fused = sys.argv[7] == "fused"  # torch's fused AdamW: its kernel moves no parameter's version counter
bnb = sys.argv[7] == "bnb"  # bitsandbytes' 8-bit AdamW: its step count a Python int
accumulate = int(sys.argv[8])  # micro-batches a step, each a step block of its own (accelerate's form)
if src != "-":
    sys.path.insert(0, src)
import torch
torch.set_num_threads(threads)
torch.manual_seed(0)
if kind == "mlp":
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    x = torch.randn(4, 64, device=device)
    size = {"samples": 4} if told else {}  # (a batch of floats: no tokens to tell)
    def loss():
        return model(x).sum()
else:
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=64, intermediate_size=256, num_attention_heads=4, num_key_value_heads=4,
                         num_hidden_layers=depth, vocab_size=1024)
    model = LlamaForCausalLM(config).to(device)
    ids = torch.randint(0, 1024, (4, 32), device=device)
    size = {"samples": 4, "tokens": 4 * 32} if told else {}
    def loss():
        return model(input_ids=ids, labels=ids).loss
if bnb:
    import warnings
    warnings.filterwarnings("ignore")
    import bitsandbytes
    opt = bitsandbytes.optim.AdamW8bit(model.parameters(), lr=1e-3, min_8bit_size=0)
else:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused or None)
tracker = None
if src == "floor":  # hooks of the kinds anatomy registers, doing nothing: what torch's dispatch costs
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    class Floor:
        def step(self, **size):
            return self
        def __enter__(self):
            self.begin_step()
            return self
        def __exit__(self, *exc):
            self.end_step()
            return False
        def begin_step(self):
            pass
        def end_step(self):
            pass
    def nothing(*args):
        return None
    model.register_forward_pre_hook(nothing, with_kwargs=True)
    model.register_forward_hook(nothing, always_call=True)
    register_optimizer_step_pre_hook(nothing)
    opt.register_step_post_hook(nothing)
    tracker = Floor()
elif src != "-":
    import anatomy
    if not anatomy.__file__.startswith(src):
        raise SystemExit(f"anatomy came from {anatomy.__file__}, not {src}")
    tracker = anatomy.track(model, opt, directory=Path(tempfile.mkdtemp()), sample_every=10**9)
print("ready", flush=True)
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
for _ in sys.stdin:
    sync()  # (each round from an idle device: what the host adds is what the step waits for)
    began, wall = time.thread_time_ns(), time.perf_counter_ns()
    for i in range(accumulate):
        last = i == accumulate - 1
        if tracker is not None:
            with tracker.step(**size):
                loss().backward()
                if last:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
        else:
            loss().backward()
            if last:
                opt.step()
                opt.zero_grad(set_to_none=True)
    cpu = (time.thread_time_ns() - began) / 1e3
    sync()
    print(cpu, (time.perf_counter_ns() - wall) / 1e3, flush=True)
"""


def export(rev: str, into: Path) -> Path:
    """The package ``anatomy`` as ``rev`` had it, under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "anatomy"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def foreign_pythonpath() -> list[str]:
    """This process's PYTHONPATH entries but those holding an ``anatomy`` package: a worker imports its own
    version of the package, ahead of nothing else that holds one (the others stay: on the GPU machine the
    carried wheels are installed into a folder named there)."""
    return [
        e
        for e in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if e and not (Path(e) / "anatomy").is_dir()
    ]


def worker_env(src: Path) -> dict[str, str]:
    """The environment of a worker importing ``anatomy`` from ``src`` (the working tree, or a revision
    exported) and the benchmarks' own modules."""
    path = [str(src), str(ROOT / "benchmarks"), *foreign_pythonpath()]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(path))


def summarize(times: dict[str, list[float]], warmup: int) -> dict[str, dict[str, float]]:
    """Per arm: the median step, and its extra over ``plain`` per round (median, quartiles, middle-80%
    mean); ``this`` also against ``base``."""
    out: dict[str, dict[str, float]] = {}
    plain = times["plain"][warmup:]

    def spread(d: list[float]) -> dict[str, float]:
        q = statistics.quantiles(d, n=4)
        cut = len(d) // 10
        middle = sorted(d)[cut : len(d) - cut] or d
        return {"median": statistics.median(d), "q1": q[0], "q3": q[2], "mean80": statistics.fmean(middle)}

    for arm, values in times.items():
        own = values[warmup:]
        extra = [a - b for a, b in zip(own, plain, strict=True)]
        out[arm] = {"step": statistics.median(own), **spread(extra)}
    base, this = times["base"][warmup:], times["this"][warmup:]
    out["this-base"] = spread([a - b for a, b in zip(this, base, strict=True)])
    if FLOOR in times:  # what the hook's own code adds over torch's dispatch of hooks that do nothing
        floor = times[FLOOR][warmup:]
        out["this-floor"] = spread([a - b for a, b in zip(this, floor, strict=True)])
    return out


def run(
    kind: str,
    depth: int,
    rounds: int,
    base_src: Path,
    threads: int,
    device: str = "cpu",
    floor: bool = False,
    cpu: int | None = None,
    told: bool = False,
    fused: bool = False,
    accumulate: int = 1,
    bnb: bool = False,
) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Thread CPU time and wall time (to the device's end of the step) per arm: their summaries. ``cpu``:
    every worker on that one CPU (all arms under the same caches and clock; on a many-core machine the
    arms otherwise land on different cores, and which arm got the better core moved per-round differences
    by ±100 µs from one run to the next), None: where the scheduler puts them."""
    ahead = kind in ("lightning", "trainer")  # (its loader fetches one batch ahead)
    worker = {"lightning": LIGHTNING_WORKER, "trainer": TRAINER_WORKER}.get(kind, WORKER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    others = foreign_pythonpath()  # (each worker puts its own version of the package ahead of them)
    if others:
        env["PYTHONPATH"] = os.pathsep.join(others)
    env["TOKENIZERS_PARALLELISM"] = "false"
    sources = {"plain": "-", "control": "-", "base": str(base_src), "this": str(ROOT)}
    if floor:
        sources[FLOOR] = FLOOR
    arms = tuple(sources)
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    size = "told" if told else "-"
    optimizer = "fused" if fused else "bnb" if bnb else "-"
    procs = {
        arm: subprocess.Popen(
            [
                *(sys.executable, "-c", worker, src, str(depth), kind, str(threads), device, size),
                *(optimizer, str(accumulate)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),
            env=env,
            preexec_fn=pin,
        )
        for arm, src in sources.items()
    }
    try:
        for arm, proc in procs.items():
            assert proc.stdout is not None
            line = proc.stdout.readline()
            while line and line.strip() != "ready":  # (what an import printed first: DeepSpeed's notice)
                line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the {arm} worker did not start")
            if ahead and proc.stdin is not None:  # (the batch the loader fetches ahead)
                proc.stdin.write("step\n")
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        walls: dict[str, list[float]] = {arm: [] for arm in arms}
        for r in range(rounds):
            for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
                proc = procs[arm]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("step\n")
                proc.stdin.flush()
                cpu, wall = proc.stdout.readline().split()
                times[arm].append(float(cpu))
                walls[arm].append(float(wall))
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=60)
    warmup = max(rounds // 10, 5)
    return summarize(times, warmup), summarize(walls, warmup)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--base", default="HEAD", help="the git revision to compare with (default HEAD)")
    ap.add_argument(
        "--models",
        default="mlp",
        help="mlp,llama,lightning,trainer (the last two: an MLP in a Lightning fit, in a Trainer run)",
    )
    ap.add_argument("--depths", default="2,8", help="blocks / layers")
    ap.add_argument("--rounds", type=int, default=2000, help="steps per arm")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--base-dir", type=Path, default=None, help="the base's package already exported here")
    ap.add_argument("--floor", action="store_true", help="an arm with do-nothing hooks too")
    ap.add_argument(
        "--told",
        action="store_true",
        help="every step told its samples (and tokens), as README's loop: then ordinary steps may rest",
    )
    ap.add_argument(
        "--fused",
        action="store_true",
        help="mlp, llama: torch's fused AdamW (the Trainer's default: no parameter's version moves)",
    )
    ap.add_argument(
        "--bnb",
        action="store_true",
        help="bitsandbytes' 8-bit AdamW (trainer: optim=paged_adamw_8bit; its step count a Python int)",
    )
    ap.add_argument(
        "--accumulate",
        type=int,
        default=1,
        help="micro-batches a step (mlp, llama: a step block each; trainer: gradient_accumulation_steps; "
        "lightning: accumulate_grad_batches)",
    )
    ap.add_argument("--cpu", type=int, default=None, help="the one CPU all workers run on (default: last)")
    ap.add_argument("--no-pin", action="store_true", help="workers where the scheduler puts them")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.fused and args.bnb:
        raise SystemExit("--fused or --bnb: one optimizer")
    load = os.getloadavg()[0]
    base = f"the package in {args.base_dir}" if args.base_dir else args.base
    pin = None if args.no_pin else (args.cpu if args.cpu is not None else max(os.sched_getaffinity(0)))
    where = "where the scheduler puts them" if pin is None else f"all on CPU {pin}"
    print(
        f"hook versions: base {base} against the working tree; load average {load:.2f}; workers {where}"
        f"{'; torch fused AdamW' if args.fused else ''}{'; bitsandbytes 8-bit AdamW' if args.bnb else ''}"
        f"{f'; {args.accumulate} micro-batches a step' if args.accumulate > 1 else ''}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        base_src = args.base_dir.resolve() if args.base_dir else export(args.base, Path(tmp))
        for kind in args.models.split(","):
            for depth in (int(d) for d in args.depths.split(",")):
                cpu, wall = run(
                    kind,
                    depth,
                    args.rounds,
                    base_src,
                    args.threads,
                    args.device,
                    args.floor,
                    pin,
                    args.told,
                    args.fused,
                    args.accumulate,
                    args.bnb,
                )
                label = f"{kind} {depth}"
                clocks = [("thread CPU", cpu)] + ([("wall", wall)] if args.device != "cpu" else [])
                for clock, res in clocks:
                    print(f"{label} on {args.device}, {clock}:", flush=True)
                    for arm in (a for a in (*ARMS, FLOOR) if a in res):
                        r = res[arm]
                        print(
                            f"  {arm:8s} step {r['step']:9.1f} µs   extra {r['median']:+7.1f} µs "
                            f"(IQR {r['q1']:+.0f}..{r['q3']:+.0f}, middle-80% mean {r['mean80']:+.1f})",
                            flush=True,
                        )
                    for key, other in (("this-base", "base"), ("this-floor", FLOOR)):
                        d = res.get(key)
                        if d is not None:
                            print(
                                f"  this − {other}, per round: {d['median']:+.1f} µs "
                                f"(IQR {d['q1']:+.0f}..{d['q3']:+.0f}, middle-80% mean {d['mean80']:+.1f})",
                                flush=True,
                            )


if __name__ == "__main__":
    main()
