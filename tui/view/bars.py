"""Block-character meters and the colour (and, without colour, the letter) of each memory component.

Colours are named ANSI colours so they survive 256-colour terminals and tmux; no gradients. Without
colour (NO_COLOR, TERM=dumb) the stacked memory bar draws each component with its own letter, the same
letter that marks its row in the table, so the bar still reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from anatomy.vocabulary import Component
from tui.component_styles import COMPONENT_STYLES

FULL = "█"
EMPTY = "░"
_EIGHTHS = " ▏▎▍▌▋▊▉"

COMPONENT_LETTERS: dict[Component, str] = {
    Component.CUDA_CONTEXT: "C",
    Component.ALLOCATOR_CACHE: "K",
    Component.RUNTIME: "R",
    Component.WEIGHTS: "W",
    Component.UNSHARDED_PARAMETERS: "P",
    Component.OTHER_MODELS: "M",
    Component.OPTIMIZER_STATES: "O",
    Component.GRADIENTS: "G",
    Component.ACTIVATIONS: "A",
    Component.INPUTS: "I",
    Component.COMMUNICATION_BUFFERS: "B",
    Component.TEMPORARIES: "T",
    Component.UNATTRIBUTED: "U",
}


def component_mark(component: Component, plain: bool) -> tuple[str, str]:
    """(character, style) that stands for ``component`` in the bar and the table."""
    if plain:
        return COMPONENT_LETTERS[component], "bold"
    return FULL, COMPONENT_STYLES[component]


def level_style(fraction: float) -> str:
    """Green below 60%, yellow below 85%, red above: how full a GPU is."""
    if fraction >= 0.85:
        return "red"
    if fraction >= 0.6:
        return "yellow"
    return "green"


def meter(fraction: float | None, width: int, style: str | None = None) -> Text:
    """A one-line meter ``█████▌░░░░`` of ``width`` cells; an empty dim track when ``fraction`` is None."""
    width = max(0, width)
    if fraction is None:
        return Text(EMPTY * width, style="bright_black")
    fraction = min(1.0, max(0.0, fraction))
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    bar = FULL * full + (_EIGHTHS[part] if part and full < width else "")
    used_style = style or level_style(fraction)
    text = Text(bar, style=used_style)
    text.append(EMPTY * (width - len(bar)), style="bright_black")
    return text


def split_cells(values: Sequence[float], width: int) -> list[int]:
    """Whole cells per value, summing to ``width`` (largest remainder), every non-zero value at least
    one cell while there is room, so a small component never vanishes from a stacked bar."""
    total = float(sum(v for v in values if v > 0))
    if width <= 0 or total <= 0:
        return [0] * len(values)
    exact = [max(0.0, v) / total * width for v in values]
    cells = [int(x) for x in exact]
    for i, v in enumerate(values):
        if v > 0 and cells[i] == 0:
            cells[i] = 1
    while sum(cells) > width:
        i = max(range(len(cells)), key=lambda j: (cells[j], -exact[j]))
        cells[i] -= 1
    order = sorted(
        (j for j in range(len(values)) if values[j] > 0), key=lambda j: exact[j] - int(exact[j]), reverse=True
    )
    k = 0
    while sum(cells) < width and order:
        cells[order[k % len(order)]] += 1
        k += 1
    return cells
