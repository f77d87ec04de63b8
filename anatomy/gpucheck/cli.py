"""``scripts/gpu_check``: train the small models on ``cuda:0`` with and without the hook and print the
verdict table; exit 0 when nothing failed (and, without CUDA, after one line saying nothing was checked)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace

from anatomy.gpucheck.probe import cuda_missing
from anatomy.gpucheck.verdicts import (
    FAIL,
    Verdict,
    component,
    exit_status,
    failed_workload,
    losses,
    managed_memory,
    mfu,
    monitor_json,
    peak_matches_user,
    peak_untouched,
    phase_times,
    reconciliation,
    table,
)

WARMUP_RUN_STEPS = 2  # the unmeasured run before each workload's compared pair (check_workload says why)

CHECKS = (
    "losses with hook = without",
    "weights vs independent count",
    "gradients vs independent count",
    "optimizer states vs independent count",
    "activations vs independent count",
    "step peak (max_memory_allocated) vs independent count",
    "user's max_memory_allocated untouched",
    "context + cache + rows = NVML",
    "CUDA-event phases vs wall clock",
    "MFU on a known GPU",
)


def _safe(workload: str, check: str, fn: Callable[[], Verdict | list[Verdict]]) -> list[Verdict]:
    """One check; its own failure is its own FAIL line, never the script's."""
    try:
        out = fn()
    except Exception as exc:
        return [Verdict(workload, check, FAIL, f"check failed: {type(exc).__name__}: {exc}"[:240])]
    return out if isinstance(out, list) else [out]


def check_workload(work: object, device: object = None) -> list[Verdict]:
    """Every check of one workload; ``device`` is ``cuda:0`` unless a test runs the pipeline elsewhere."""
    import torch

    from anatomy.gpucheck.workloads import Run, Workload, publishing_dir, release, train
    from anatomy.peaks import peak_flops
    from anatomy.vocabulary import Component
    from tui.sources.reconcile import reconcile

    assert isinstance(work, Workload)
    name = work.name
    dev = device if isinstance(device, torch.device) else torch.device("cuda", 0)
    try:
        with publishing_dir() as directory:
            # A run before the two compared: the process's first training on a GPU makes the libraries'
            # workspaces (cuBLAS's among them) through the caching allocator inside its first step, after
            # the user's reset — on an H100 and an H200 that first run's step-0 peak read 30.5 MiB higher,
            # and its later steps 0.31 MiB lower, than every run after it, with the hook or without (runs
            # 2 to 6 identical): comparing against that run would charge the libraries' start to the hook.
            train(replace(work, steps=WARMUP_RUN_STEPS, monitor=False), False, directory, dev)
            release()
            plain = train(work, False, directory, dev)
            release()
            hooked = train(work, True, directory, dev)
            release()
    except Exception as exc:
        names = CHECKS + (("paged optimizer: managed memory named",) if "paged" in name else ())
        return failed_workload(name, names, exc)
    snap, hello = hooked.snapshot, hooked.hello
    assert isinstance(plain, Run) and snap is not None and hello is not None
    mem = snap.memory
    rec = reconcile(hello, snap, hooked.nvml)
    row_bytes = {r.component: r.bytes for r in rec.rows}
    context = row_bytes.get(Component.CUDA_CONTEXT)
    cache = row_bytes.get(Component.ALLOCATOR_CACHE)
    rows = rec.measured_sum - (context or 0) - (cache or 0)
    out: list[Verdict] = []
    checks: list[tuple[str, Callable[[], Verdict | list[Verdict]]]] = [
        (CHECKS[0], lambda: losses(name, plain.losses, hooked.losses)),
        (CHECKS[1], lambda: component(name, "weights", mem.get(Component.WEIGHTS), hooked.weights)),
        (CHECKS[2], lambda: component(name, "gradients", mem.get(Component.GRADIENTS), hooked.gradients)),
        (
            CHECKS[3],
            lambda: component(
                name, "optimizer states", mem.get(Component.OPTIMIZER_STATES), hooked.optimizer_states
            ),
        ),
        (
            CHECKS[4],
            lambda: component(name, "activations", mem.get(Component.ACTIVATIONS), hooked.activations, 0.05),
        ),
        (CHECKS[5], lambda: peak_matches_user(name, hooked.hook_peaks[-1], hooked.user_peaks[-1])),
        (CHECKS[6], lambda: peak_untouched(name, plain.user_peaks, hooked.user_peaks, hooked.hook_resets)),
        (
            CHECKS[7],
            lambda: reconciliation(
                name,
                nvml=hooked.nvml,
                total_source=rec.total_source,
                reconciles=rec.reconciles,
                rows=rows,
                context=context,
                cache=cache,
                managed=rec.managed_bytes,
                note=rec.note,
            ),
        ),
        (
            CHECKS[8],
            lambda: phase_times(
                name,
                forward=hooked.phase("forward_s"),
                backward=hooked.phase("backward_s"),
                optimizer=hooked.phase("optimizer_s"),
                step=hooked.phase("step_s"),
                wall=hooked.wall(),
            ),
        ),
    ]

    def mfu_check() -> Verdict:
        peak = peak_flops(hello.device_name or "", hello.precision, bool(hello.tf32))
        wall = hooked.wall()
        independent = plain.flops / wall / 1e12 if plain.flops and wall else None
        return mfu(
            name,
            device=hello.device_name or "?",
            hook_mfu=snap.mfu,
            hook_tflops=snap.achieved_tflops,
            independent_tflops=independent,
            peak_tflops=peak / 1e12 if peak else None,
        )

    checks.append((CHECKS[9], mfu_check))
    if "paged" in name:
        checks.append(
            (
                "paged optimizer: managed memory named",
                lambda: managed_memory(
                    name,
                    hook_managed=snap.cuda.managed if snap.cuda is not None else None,
                    independent=hooked.paged,
                    taken=rec.managed_bytes,
                    nvml=hooked.nvml,
                    reserved=snap.cuda.reserved if snap.cuda is not None else None,
                    context=context,
                ),
            )
        )
    if work.monitor:
        doc, error = hooked.monitor, hooked.monitor_error

        def monitor() -> list[Verdict]:
            if doc is None:
                return [Verdict("monitor", "anatomy-top --once --json", FAIL, error or "not run")]
            return monitor_json(doc, os.getpid())

        checks.append(("anatomy-top --once --json", monitor))
    for check, fn in checks:
        out.extend(_safe(name, check, fn))
    return out


def header() -> str:
    import torch

    props = torch.cuda.get_device_properties(0)
    return (
        f"gpu_check: {props.name} ({props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, pid {os.getpid()}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    reason = cuda_missing()
    if reason is not None:
        print(f"gpu_check: no CUDA here, nothing checked: {reason}")
        return 0
    from anatomy.gpucheck.resting import check_resting
    from anatomy.gpucheck.workloads import WORKLOADS

    verdicts: list[Verdict] = []
    try:
        print(header(), flush=True)
    except Exception as exc:
        print(f"gpu_check: could not describe cuda:0 ({type(exc).__name__}: {exc})", flush=True)
    for work in WORKLOADS:
        verdicts.extend(check_workload(work))
    verdicts.extend(check_resting())
    print(table(verdicts))
    return exit_status(verdicts)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
