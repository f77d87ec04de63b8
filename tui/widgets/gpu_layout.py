"""The GPU table's two layouts, as text (no Textual: the start-up frame draws them too), of each GPU's
``GpuView`` (tui.view.gpus: its fields already in words).

- ``full``: every field of nvidia-smi's default view on two lines per GPU, the way nvidia-smi itself
  stacks them, fitted to the width it is given (names shortened, meters narrowed, gaps closed, in that
  order) so that nothing needs sideways scrolling from about 72 columns up;
- ``compact``: one line per GPU, as many fields as the width holds in the order an engineer looks at
  them (memory, utilisation, temperature, power, then the rest); never a sideways scroll.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text

from tui import format as fmt
from tui.sources.model import GpuInfo
from tui.view.bars import meter
from tui.view.gpus import GpuFields, GpuView

FULL, COMPACT = "full", "compact"
METER_WIDTH = 8  # compact mode, where the width allows
COMPACT_METERS = (8, 6, 4)
COMPACT_GAP = 2
COMPACT_CORE = 6  # GPU, name, memory, utilisation, temperature, power: what compact mode is for
METER_MIN, METER_MAX = 4, 10  # full mode: what the width allows, within these
NAME_MIN = 8
LINE_LEAD = 1  # the table draws one space before the first field

COMPACT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("gpu", "GPU"),
    ("name", "Name"),
    ("memory", "Memory-Usage"),
    ("util", "GPU-Util"),
    ("temp", "Temp"),
    ("power", "Pwr:Usage/Cap"),
    ("mem_util", "Mem-Util"),
    ("fan", "Fan"),
    ("perf", "Perf"),
    ("ecc", "Uncorr. ECC"),
    ("persistence", "Persist-M"),
    ("display", "Disp.A"),
    ("bus", "Bus-Id"),
    ("compute", "Compute M."),
    ("mig", "MIG M."),
)
COLUMN_KEYS: tuple[str, ...] = tuple(k for k, _ in COMPACT_COLUMNS)
COMPACT_JUSTIFY = {"gpu": "right", "mem_util": "right", "temp": "right", "power": "right", "fan": "right"}

def _na(value: str) -> Text:
    return Text(value, style="bright_black") if value == fmt.NA else Text(value)


def _fields(index: int, f: GpuFields, meter_width: int) -> dict[str, Text]:
    """Every field's cell (without the name), its meters ``meter_width`` cells wide."""
    memory = meter(f.memory_fraction, meter_width)
    memory.append(" ")
    memory.append(f.memory)
    util = meter(f.util_fraction, meter_width)
    util.append(f" {f.util:>4}")
    return {
        "gpu": Text(str(index)),
        "memory": memory,
        "util": util,
        "mem_util": _na(f.mem_util),
        "temp": _na(f.temp),
        "power": Text(f.power),
        "fan": _na(f.fan),
        "perf": _na(f.perf),
        "ecc": _na(f.ecc),
        "persistence": _na(f.persistence),
        "display": _na(f.display),
        "bus": _na(f.bus),
        "compute": _na(f.compute),
        "mig": _na(f.mig),
    }


def _lost(gpu: GpuInfo) -> Text:
    lost = Text("GPU lost", style="bold red")
    if gpu.error:
        lost.append(": ")
        lost.append(Text(gpu.error))
    return lost


def gpu_cells(view: GpuView, meter_width: int = METER_WIDTH, at_widest: bool = False) -> tuple[Text, ...]:
    """The compact row: one cell per COMPACT_COLUMNS entry (``at_widest``: of the GPU's widest values)."""
    gpu = view.gpu
    if gpu.lost:
        return (Text(str(gpu.index)), _lost(gpu), *(Text("") for _ in COMPACT_COLUMNS[2:]))
    cells = _fields(gpu.index, view.widest if at_widest else view.fields, meter_width)
    cells["name"] = Text(view.short_name)
    return tuple(cells[key] for key in COLUMN_KEYS)


@dataclass(frozen=True)
class CompactLayout:
    meter_width: int
    columns: int  # how many of COMPACT_COLUMNS, from the left


def compact_layout(gpus: Sequence[GpuView], width: int) -> CompactLayout:
    """The widest meters with which the core fields (through power) still fit ``width``, then as many
    more fields as fit; where even the core does not fit, the most fields with the narrowest meters
    (at least GPU, name and memory). Sized for each GPU's widest values."""
    room = max(0, width - LINE_LEAD)
    healthy = [g for g in gpus if not g.lost]
    fits: list[CompactLayout] = []
    for meter_width in COMPACT_METERS:
        rows = [gpu_cells(g, meter_width, at_widest=True) for g in healthy]
        widths = [
            max([Text(label).cell_len, *(r[i].cell_len for r in rows)])
            for i, (_, label) in enumerate(COMPACT_COLUMNS)
        ]
        used, count = -COMPACT_GAP, 0
        for w in widths:
            if used + COMPACT_GAP + w > room:
                break
            used += COMPACT_GAP + w
            count += 1
        fits.append(CompactLayout(meter_width, max(3, count)))
    core = [f for f in fits if f.columns >= COMPACT_CORE]
    if core:
        return core[0]  # COMPACT_METERS run widest first
    return max(fits, key=lambda f: (f.columns, f.meter_width))


# ----------------------------------------------------------------------------------------- full
@dataclass(frozen=True)
class Field:
    key: str
    label: str
    justify: str = "left"


# nvidia-smi's three cells per GPU, read left to right on its first two lines, MIG moved up to the first.
FULL_LINES: tuple[tuple[Field, ...], tuple[Field, ...]] = (
    (
        Field("gpu", "GPU", "right"),
        Field("name", "Name"),
        Field("persistence", "Persist-M", "right"),
        Field("bus", "Bus-Id"),
        Field("display", "Disp.A", "right"),
        Field("ecc", "Uncorr. ECC", "right"),
        Field("mig", "MIG M.", "right"),
    ),
    (
        Field("fan", "Fan", "right"),
        Field("temp", "Temp", "right"),
        Field("perf", "Perf"),
        Field("power", "Pwr:Usage/Cap", "right"),
        Field("memory", "Memory-Usage"),
        Field("util", "GPU-Util"),
        Field("compute", "Compute M.", "right"),
    ),
)
FULL_FIELD_KEYS: frozenset[str] = frozenset(f.key for line in FULL_LINES for f in line)


@dataclass(frozen=True)
class FullLayout:
    """Widths for one table width: per line, each field's width and the gap between fields."""

    widths: tuple[tuple[int, ...], tuple[int, ...]]
    gaps: tuple[int, int]
    meter_width: int
    name_width: int
    short_names: bool

    @property
    def line_width(self) -> int:
        return max(sum(w) + g * (len(w) - 1) for w, g in zip(self.widths, self.gaps, strict=True))


def layout_key(views: Sequence[GpuView], width: int) -> tuple[object, ...]:
    """What a full layout depends on: it is computed again only when this changes."""
    gpus = [v.gpu for v in views]
    return (
        width,
        tuple(
            (
                g.index,
                g.lost,
                g.name,
                g.memory_total,
                g.power_limit_w,
                g.power_w is None,
                g.compute_mode,
                g.mig_mode,
                g.ecc_volatile_uncorrected,
                g.bus_id,
                g.persistence_mode,
                g.display_active,
            )
            for g in gpus
        ),
    )


def _natural_widths(line: Sequence[Field], cells: Sequence[dict[str, Text]]) -> list[int]:
    return [max([Text(f.label).cell_len, *(c[f.key].cell_len for c in cells if f.key in c)]) for f in line]


def full_layout(gpus: Sequence[GpuView], width: int) -> FullLayout:
    """Fit both lines into ``width`` cells (the table's line, without its leading space): full names,
    then nvidia-smi's names without the vendor, then narrower meters, gaps of one, shortened names."""
    room = max(0, width - LINE_LEAD)
    # Sized for each GPU's widest values (memory full, power at its cap, 100%), so columns stay put
    # while the numbers move.
    healthy = [g for g in gpus if not g.lost]

    def widths_for(meter_width: int, short: bool) -> tuple[list[int], list[int], int]:
        cells = [_fields(g.index, g.widest, meter_width) for g in healthy]
        for c, g in zip(cells, healthy, strict=True):
            c["name"] = Text(g.short_name if short else g.name)
        first, second = _natural_widths(FULL_LINES[0], cells), _natural_widths(FULL_LINES[1], cells)
        return first, second, first[1]

    # In order of preference: gaps of two, meters of 6+ cells, full names; then give up each in turn.
    best: FullLayout | None = None
    for gap in (2, 1):
        for short, meter_min in ((False, 6), (True, 6), (False, METER_MIN), (True, METER_MIN)):
            for meter_width in range(METER_MAX, meter_min - 1, -1):
                first, second, name_w = widths_for(meter_width, short)
                layout = FullLayout((tuple(first), tuple(second)), (gap, gap), meter_width, name_w, short)
                if layout.line_width <= room:
                    return layout
                best = layout
    # Nothing fits at full length: the shortest layout, the name column shortened to what is left.
    assert best is not None
    first = list(best.widths[0])
    others = sum(first) - first[1] + best.gaps[0] * (len(first) - 1)
    first[1] = max(NAME_MIN, room - others)
    return FullLayout((tuple(first), best.widths[1]), best.gaps, best.meter_width, first[1], True)


def _join(line: Sequence[Field], widths: Sequence[int], gap: int, cells: dict[str, Text]) -> Text:
    out = Text(no_wrap=True, end="")
    for i, (f, w) in enumerate(zip(line, widths, strict=True)):
        if i:
            out.append(" " * gap)
        cell = cells.get(f.key, Text())
        if cell.cell_len > w:
            cell = cell.copy()
            cell.truncate(max(0, w - 1))
            cell.append("…")
        pad = " " * (w - cell.cell_len)
        if f.justify == "right":
            out.append(pad)
            out.append_text(cell)
        else:
            out.append_text(cell)
            out.append(pad)
    return out


def full_header(layout: FullLayout) -> str:
    """The two header lines, joined by a line break."""
    lines = []
    for line, widths, gap in zip(FULL_LINES, layout.widths, layout.gaps, strict=True):
        labels = {f.key: Text(f.label) for f in line}
        lines.append(_join(line, widths, gap, labels).plain.rstrip())
    return "\n".join(lines)


def full_lines(view: GpuView, layout: FullLayout) -> tuple[Text, Text]:
    """One GPU's two lines."""
    gpu = view.gpu
    if gpu.lost:
        first = Text(no_wrap=True, end="")
        first.append(f"{gpu.index:>{layout.widths[0][0]}}")
        first.append(" " * layout.gaps[0])
        first.append_text(_lost(gpu))
        return first, Text("")
    cells = _fields(gpu.index, view.fields, layout.meter_width)
    cells["name"] = Text(view.short_name if layout.short_names else view.name)
    return tuple(  # type: ignore[return-value]
        _join(line, widths, gap, cells)
        for line, widths, gap in zip(FULL_LINES, layout.widths, layout.gaps, strict=True)
    )
