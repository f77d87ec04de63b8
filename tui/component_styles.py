"""The colour of each memory component: one palette for the live monitor's bars (``tui.view.bars``)
and the run report's charts (``tui.runreport``), which imports nothing of the Textual app.

Colours are named ANSI colours so they survive 256-colour terminals and tmux; no gradients.
"""

from __future__ import annotations

from anatomy.vocabulary import Component

COMPONENT_STYLES: dict[Component, str] = {
    Component.CUDA_CONTEXT: "bright_black",
    Component.ALLOCATOR_CACHE: "white",
    Component.RUNTIME: "bright_black",
    Component.WEIGHTS: "blue",
    Component.UNSHARDED_PARAMETERS: "bright_blue",
    Component.OTHER_MODELS: "steel_blue",
    Component.OPTIMIZER_STATES: "magenta",
    Component.GRADIENTS: "yellow",
    Component.ACTIVATIONS: "green",
    Component.INPUTS: "bright_green",
    Component.COMMUNICATION_BUFFERS: "bright_cyan",
    Component.TEMPORARIES: "cyan",
    # Grey, not red: unattributed memory is not an alarm, and red means "full" in the GPU bars.
    Component.UNATTRIBUTED: "grey58",
}

__all__ = ["COMPONENT_STYLES"]
