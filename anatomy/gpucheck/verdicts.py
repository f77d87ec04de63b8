"""The verdicts of the GPU check: each compares what the hook (or the monitor) reports with an independent
figure, and says PASS, FAIL or SKIP in one line. Pure functions of numbers: no torch, no GPU."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PASS, FAIL, SKIP = "PASS", "FAIL", "SKIP"
GIB = 1024**3
# A CUDA context (driver state, kernels of the loaded libraries) is a few hundred MiB to ~2 GiB; more than
# this left over once the allocator's reserved bytes are taken out means something is not accounted for.
MAX_CONTEXT = 4 * GIB


@dataclass(frozen=True)
class Verdict:
    workload: str
    check: str
    status: str  # PASS | FAIL | SKIP
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def mib(n: float | None) -> str:
    return "—" if n is None else f"{n / 2**20:,.2f} MiB"


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def component(
    workload: str, name: str, hook: int | None, independent: int | None, tolerance: float = 0.0
) -> Verdict:
    """A memory component against the independent count (exact unless a tolerance is given)."""
    check = f"{name} vs independent count"
    if hook is None:
        return Verdict(
            workload, check, FAIL, f"the hook left {name} unmeasured (independent: {mib(independent)})"
        )
    if independent is None:
        return Verdict(workload, check, FAIL, f"no independent count (hook: {mib(hook)})")
    ok = hook == independent if tolerance == 0 else _rel(hook, independent) <= tolerance
    within = "exact" if tolerance == 0 else f"within {tolerance:.0%}"
    return Verdict(
        workload, check, PASS if ok else FAIL, f"hook {mib(hook)}, independent {mib(independent)} ({within})"
    )


def reconciliation(
    workload: str,
    *,
    nvml: int | None,
    total_source: str,
    reconciles: bool,
    rows: int,
    context: int | None,
    cache: int | None,
    managed: int = 0,
    note: str | None = None,
) -> Verdict:
    """CUDA context + allocator cache + the rows (+ managed memory) = NVML's per-process figure, with a
    plausible context."""
    check = "context + cache + rows = NVML"
    if nvml is None:
        return Verdict(workload, check, FAIL, "NVML lists no memory for this process")
    if total_source != "nvml":
        return Verdict(
            workload, check, FAIL, f"the total is {total_source!r}, not NVML's figure ({note or ''})"
        )
    if not reconciles or context is None:
        return Verdict(
            workload, check, FAIL, f"does not add up to NVML {mib(nvml)}: {note or 'unmeasured rows'}"
        )
    if context > MAX_CONTEXT:
        return Verdict(
            workload, check, FAIL, f"CUDA context {mib(context)} is implausibly large (> {mib(MAX_CONTEXT)})"
        )
    paged = f" + managed {mib(managed)}" if managed else ""
    return Verdict(
        workload,
        check,
        PASS,
        f"context {mib(context)} + cache {mib(cache)} + rows {mib(rows)}{paged} = NVML {mib(nvml)}",
    )


def peak_untouched(workload: str, without_hook: list[int], with_hook: list[int], hook_resets: int) -> Verdict:
    """The user's ``torch.cuda.max_memory_allocated()`` reads the same with the hook as without it, and the
    hook never reset the peak."""
    check = "user's max_memory_allocated untouched"
    if hook_resets:
        return Verdict(
            workload, check, FAIL, f"the hook called reset_peak_memory_stats {hook_resets} time(s)"
        )
    if not without_hook or len(without_hook) != len(with_hook):
        return Verdict(
            workload, check, FAIL, f"readings missing ({len(without_hook)} vs {len(with_hook)} steps)"
        )
    diffs = [b - a for a, b in zip(without_hook, with_hook, strict=True)]
    if any(diffs):
        worst = max(diffs, key=abs)
        return Verdict(workload, check, FAIL, f"differs with the hook by up to {mib(worst)} per step")
    return Verdict(
        workload, check, PASS, f"{len(with_hook)} steps identical, peak {mib(max(with_hook))}, no reset"
    )


def peak_matches_user(workload: str, hook_peak: int | None, user_peak: int | None) -> Verdict:
    """With the user resetting the peak each step, the hook's step peak is exact: it equals what the user
    reads from ``max_memory_allocated()`` for that step."""
    return component(workload, "step peak (max_memory_allocated)", hook_peak, user_peak)


def phase_times(
    workload: str,
    *,
    forward: float | None,
    backward: float | None,
    optimizer: float | None,
    step: float | None,
    wall: float | None,
    tolerance: float = 0.15,
) -> Verdict:
    """CUDA-event phase times: each measured, their sum within the step, and the step within ``tolerance``
    of the wall clock per step (synchronized)."""
    check = "CUDA-event phases vs wall clock"
    parts = {"forward": forward, "backward": backward, "optimizer": optimizer, "step": step}
    missing = [k for k, v in parts.items() if v is None]
    if missing:
        return Verdict(workload, check, FAIL, "unmeasured: " + ", ".join(missing))
    if wall is None or wall <= 0:
        return Verdict(workload, check, FAIL, "no wall-clock reference")
    assert forward is not None and backward is not None and optimizer is not None and step is not None
    total = forward + backward + optimizer
    detail = (
        f"fwd {forward * 1e3:.1f} + bwd {backward * 1e3:.1f} + opt {optimizer * 1e3:.1f} "
        f"= {total * 1e3:.1f} ms; step {step * 1e3:.1f} ms, wall {wall * 1e3:.1f} ms"
    )
    if total > step * (1 + tolerance):
        return Verdict(workload, check, FAIL, "phases exceed the step: " + detail)
    if _rel(step, wall) > tolerance:
        return Verdict(workload, check, FAIL, f"step off the wall clock by {_rel(step, wall):.0%}: " + detail)
    return Verdict(workload, check, PASS, detail)


def mfu(
    workload: str,
    *,
    device: str,
    hook_mfu: float | None,
    hook_tflops: float | None,
    independent_tflops: float | None,
    peak_tflops: float | None,
    tolerance: float = 0.25,
) -> Verdict:
    """MFU on a GPU whose peak is known: the hook's achieved TFLOP/s within ``tolerance`` of FLOPs counted
    independently over the wall clock, and MFU = achieved / peak."""
    check = "MFU on a known GPU"
    if peak_tflops is None:
        return Verdict(workload, check, SKIP, f"no peak FLOP/s known for {device!r}")
    if hook_mfu is None or hook_tflops is None:
        return Verdict(
            workload, check, FAIL, f"the hook published no MFU on {device!r} (peak {peak_tflops:.0f} TFLOP/s)"
        )
    if independent_tflops is None:
        return Verdict(workload, check, FAIL, "no independent FLOP count")
    detail = (
        f"hook {hook_tflops:.1f} TFLOP/s (MFU {hook_mfu:.1%}), independent {independent_tflops:.1f} TFLOP/s, "
        f"peak {peak_tflops:.0f}"
    )
    if _rel(hook_mfu, hook_tflops / peak_tflops) > 0.01:
        return Verdict(workload, check, FAIL, "MFU is not achieved / peak: " + detail)
    if _rel(hook_tflops, independent_tflops) > tolerance:
        return Verdict(workload, check, FAIL, "achieved TFLOP/s off the independent figure: " + detail)
    return Verdict(workload, check, PASS, detail)


def managed_memory(
    workload: str,
    *,
    hook_managed: int | None,
    independent: int,
    taken: int,
    nvml: int | None,
    reserved: int | None,
    context: int | None,
) -> Verdict:
    """A paged optimizer's managed memory is its own figure: the hook's equals bitsandbytes' paged state
    tensors, and the monitor takes it out of NVML's figure before calling the rest CUDA context."""
    check = "paged optimizer: managed memory named"
    if independent <= 0:
        return Verdict(workload, check, FAIL, "the optimizer holds no paged tensors (is_paged) to check")
    if not hook_managed:
        return Verdict(
            workload, check, FAIL, f"the hook published no managed figure (paged states {mib(independent)})"
        )
    if hook_managed != independent:
        return Verdict(workload, check, FAIL, f"hook {mib(hook_managed)} vs paged states {mib(independent)}")
    if nvml is None or reserved is None or context is None:
        return Verdict(workload, check, FAIL, "no NVML figure to take it out of")
    if context + taken != nvml - reserved or taken > hook_managed:
        return Verdict(
            workload, check, FAIL, f"context {mib(context)} + managed {mib(taken)} != NVML − reserved"
        )
    return Verdict(
        workload,
        check,
        PASS,
        f"managed {mib(hook_managed)} (in NVML's figure: {mib(taken)}), "
        f"CUDA context {mib(context)} without it",
    )


def monitor_json(doc: Mapping[str, Any], pid: int) -> list[Verdict]:
    """``anatomy-top --once --json`` on the real NVML: the driver read, this process listed with its GPU
    memory, and its anatomy reconciled against NVML's figure."""
    w = "monitor"
    out: list[Verdict] = []
    nvml = doc.get("nvml") or {}
    mine = [t for t in doc.get("training") or [] if t.get("pid") == pid]
    if not nvml.get("available"):
        out.append(Verdict(w, "NVML read", FAIL, f"not available: {nvml.get('reason')}"))
        listed = "listed among the training processes" if mine else "not among the training processes either"
        out.append(
            Verdict(w, "anatomy reconciled", FAIL, f"no NVML figure to reconcile with; pid {pid} {listed}")
        )
        return out
    gpus = doc.get("gpus") or []
    out.append(
        Verdict(
            w, "NVML read", PASS if gpus else FAIL, f"driver {nvml.get('driver_version')}, {len(gpus)} GPU(s)"
        )
    )
    procs = [p for p in doc.get("processes") or [] if p.get("pid") == pid]
    used = max((p.get("gpu_memory") or 0 for p in procs), default=0)
    out.append(
        Verdict(
            w,
            "this process in NVML's list",
            PASS if used > 0 else FAIL,
            f"pid {pid}: {mib(used) if procs else 'absent'}",
        )
    )
    if not mine:
        out.append(Verdict(w, "anatomy reconciled", FAIL, f"pid {pid} not among the training processes"))
        return out
    rec = mine[0].get("reconciled") or {}
    ok = rec.get("total_source") == "nvml" and rec.get("reconciles") is True
    detail = (
        f"total {mib(rec.get('total'))} from {rec.get('total_source')}, reconciles={rec.get('reconciles')}"
    )
    if rec.get("note") and not ok:
        detail += f": {rec.get('note')}"
    out.append(Verdict(w, "anatomy reconciled", PASS if ok else FAIL, detail))
    return out


def failed_workload(workload: str, checks: Iterable[str], error: BaseException) -> list[Verdict]:
    """A workload that could not run: each of its checks fails, saying why."""
    why = f"{type(error).__name__}: {error}".splitlines()[0][:200]
    return [Verdict(workload, c, FAIL, f"not run: {why}") for c in checks]


def table(verdicts: list[Verdict]) -> str:
    rows = [("WORKLOAD", "CHECK", "VERDICT", "DETAIL")] + [
        (v.workload, v.check, v.status, v.detail) for v in verdicts
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}" for r in rows]
    passed = sum(v.status == PASS for v in verdicts)
    failed = sum(v.failed for v in verdicts)
    skipped = len(verdicts) - passed - failed
    lines.append(f"{passed} passed, {failed} failed, {skipped} skipped")
    return "\n".join(lines)


def exit_status(verdicts: list[Verdict]) -> int:
    return 1 if any(v.failed for v in verdicts) else 0


def losses(workload: str, plain: list[float], hooked: list[float], tolerance: float = 1e-3) -> Verdict:
    """The same losses with and without the hook: bit-identical, or within ``tolerance`` where the GPU's
    own kernels are not deterministic (atomics in an embedding's backward)."""
    check = "losses with hook = without"
    if not plain or len(plain) != len(hooked):
        return Verdict(workload, check, FAIL, f"{len(plain)} vs {len(hooked)} losses")
    if plain == hooked:
        return Verdict(workload, check, PASS, f"{len(plain)} steps bit-identical")
    worst = max(_rel(b, a) for a, b in zip(plain, hooked, strict=True))
    status = PASS if worst <= tolerance else FAIL
    return Verdict(
        workload,
        check,
        status,
        f"largest relative difference {worst:.2e} (GPU nondeterminism allows {tolerance:.0e})",
    )


def resting_same(
    workload: str,
    full: list[dict[str, Any]],
    rest: list[dict[str, Any]],
    full_peaks: list[int],
    rest_peaks: list[int],
) -> Verdict:
    """A run whose ordinary steps rest publishes what the same run with every step built the full way
    publishes, step for step and field for field, and the user's own ``max_memory_allocated()`` after each
    step reads the same."""
    check = "resting steps = every step built"
    if not full or len(full) != len(rest):
        return Verdict(workload, check, FAIL, f"{len(full)} vs {len(rest)} steps in the history")
    for a, b in zip(full, rest, strict=True):
        if a != b:
            fields = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            return Verdict(workload, check, FAIL, f"step {a.get('step')} differs in {', '.join(fields)}")
    if full_peaks != rest_peaks:
        pairs = zip(full_peaks, rest_peaks, strict=False)
        at = next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(full_peaks), len(rest_peaks)))
        return Verdict(workload, check, FAIL, f"the user's max_memory_allocated differs after step {at}")
    peaks = f", user's peak {mib(full_peaks[-1])} every step alike" if full_peaks else ""
    return Verdict(workload, check, PASS, f"{len(full)} steps identical in every field{peaks}")


def rested(
    workload: str,
    rested_blocks: int,
    blocks: int,
    step_s: tuple[float, float] | None = None,
    least: float = 0.5,
) -> Verdict:
    """Most step blocks rested (else the comparison beside this one checked the full way against itself).
    ``step_s``: the mean step resting and with every step built, said beside (not judged: a few dozen steps
    with their first ones)."""
    share = rested_blocks / blocks if blocks else 0.0
    status = PASS if share >= least else FAIL
    detail = f"{rested_blocks} of {blocks} step blocks rested ({share:.0%}; at least {least:.0%} wanted)"
    if step_s is not None:
        detail += f"; a step {step_s[0] * 1e3:.3f} ms, every step built {step_s[1] * 1e3:.3f} ms"
    return Verdict(workload, "ordinary steps rested", status, detail)
