"""One rank of a data-parallel job as text: a table per kind (FSDP2, DDP, ZeRO), a column per world size.

No torch here (the figures come computed in :class:`~anatomy.plan.sharding.RankPlan`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

from anatomy.plan.report import INDENT, wrap
from anatomy.units import fmt_bytes
from anatomy.vocabulary import Component

if TYPE_CHECKING:
    from anatomy.plan.sharding import RankPlan

KIND_TITLES = {
    "fsdp": "FSDP2 (fully_shard per block + root)",
    "ddp": "DDP",
    "zero1": "DeepSpeed ZeRO-1",
    "zero2": "DeepSpeed ZeRO-2",
    "zero3": "DeepSpeed ZeRO-3",
}
ROWS = (
    Component.CUDA_CONTEXT,
    Component.ALLOCATOR_CACHE,
    Component.WEIGHTS,
    Component.UNSHARDED_PARAMETERS,
    Component.OPTIMIZER_STATES,
    Component.GRADIENTS,
    Component.ACTIVATIONS,
    Component.COMMUNICATION_BUFFERS,
    Component.TEMPORARIES,
)
_LABEL, _COL, _PER_TABLE = 24, 12, 4  # 4 columns fit 80 with the label


def render_ranks(plans: list[RankPlan], out: TextIO) -> None:
    w = out.write
    kinds = list(dict.fromkeys(p.kind for p in plans))
    for kind in kinds:
        mine = [p for p in plans if p.kind == kind]
        for start in range(0, len(mine), _PER_TABLE):
            cols = mine[start : start + _PER_TABLE]
            w("\n")
            w(wrap(f"One rank of {KIND_TITLES.get(kind, kind)}: rank 0's memory by world size", ""))
            w(
                f"{INDENT}{'Component':<{_LABEL}}"
                + "".join(f"{f'N={p.world_size}':>{_COL}}" for p in cols)
                + "\n"
            )
            for comp in ROWS:
                values = [p.components.get(comp) for p in cols]
                if all(v is None for v in values):
                    continue
                cells = "".join(f"{fmt_bytes(v) if v is not None else '-':>{_COL}}" for v in values)
                w(f"{INDENT}{comp.label:<{_LABEL}}{cells}\n")
            w(
                f"{INDENT}{'Peak (tensors)':<{_LABEL}}"
                + "".join(f"{fmt_bytes(p.peak_bytes):>{_COL}}" for p in cols)
                + "\n"
            )
            w(
                f"{INDENT}{'  phase':<{_LABEL}}"
                + "".join(f"{p.peak_phase.value:>{_COL}}" for p in cols)
                + "\n"
            )
            if any(p.fits is not None for p in cols):
                w(
                    f"{INDENT}{'Total':<{_LABEL}}"
                    + "".join(f"{fmt_bytes(p.total_bytes):>{_COL}}" for p in cols)
                    + "\n"
                )
                fits = ["-" if p.fits is None else ("yes" if p.fits else "NO") for p in cols]
                w(f"{INDENT}{'Fits':<{_LABEL}}" + "".join(f"{f:>{_COL}}" for f in fits) + "\n")
        for note in dict.fromkeys(n for p in mine for n in p.notes):
            w(wrap(f"note: {note}", hanging="      "))


__all__ = ["render_ranks"]
