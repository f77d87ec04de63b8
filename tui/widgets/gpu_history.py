"""Per-GPU history: a utilization and a memory sparkline per GPU, one line each, from the data layer's
``MachineHistory`` (the ``h`` key shows and hides it)."""

from __future__ import annotations

from collections.abc import Sequence

from textual import events

from tui.sources.history import MachineHistory
from tui.sources.model import GpuInfo
from tui.view.gpu_history import history_lines
from tui.widgets.text_static import TextStatic


class GpuHistory(TextStatic):
    def __init__(self, **kwargs: object) -> None:
        super().__init__("", **kwargs)
        self._gpus: Sequence[GpuInfo] = ()
        self._history: MachineHistory | None = None

    def show(self, gpus: Sequence[GpuInfo], history: MachineHistory) -> None:
        self._gpus, self._history = gpus, history
        self._draw()

    def _draw(self) -> None:
        if self._history is None:
            return
        width = self.content_size.width or max(20, self.app.size.width - 2)
        self.show_text(history_lines(self._gpus, self._history, width))

    def on_resize(self, event: events.Resize) -> None:
        self._draw()


__all__ = ["GpuHistory"]
