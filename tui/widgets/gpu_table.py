"""The GPU table: every field of nvidia-smi's default view, in one of two layouts (``f`` switches):
``full``, two lines per GPU fitted to the pane, nothing hidden; ``compact``, one line per GPU, the most
looked-at fields first and the rest a sideways scroll away. See tui.widgets.gpu_layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tui.view.gpus import GpuView
from tui.widgets.gpu_layout import (
    COLUMN_KEYS,
    COMPACT,
    COMPACT_COLUMNS,
    COMPACT_JUSTIFY,
    FULL,
    CompactLayout,
    FullLayout,
    compact_layout,
    full_header,
    full_layout,
    full_lines,
    gpu_cells,
    layout_key,
)
from tui.widgets.line_table import LineTable

__all__ = ["COLUMN_KEYS", "COMPACT", "FULL", "GpuTable", "gpu_cells"]

_COMPACT = [(key, label, COMPACT_JUSTIFY.get(key, "left")) for key, label in COMPACT_COLUMNS]


class GpuTable(LineTable):
    def __init__(self, mode: str = COMPACT, **kwargs: Any) -> None:
        super().__init__(_COMPACT, **kwargs)
        self.mode = COMPACT
        self._gpus: tuple[GpuView, ...] = ()
        self._layout: tuple[tuple[object, ...], FullLayout | CompactLayout] | None = None
        self.set_mode(mode)

    @property
    def gpu_count(self) -> int:
        return len(self._gpus)

    def set_mode(self, mode: str) -> None:
        if mode not in (FULL, COMPACT):
            raise ValueError(f"unknown GPU table mode {mode!r}")
        if mode == self.mode and self.columns:
            return
        self.mode = mode
        self._layout = None
        self.show(self._gpus)

    def show(self, gpus: Sequence[GpuView]) -> None:
        """Draw ``gpus`` (tui.view.gpus: their fields already in words) in the current layout."""
        self._gpus = tuple(sorted(gpus, key=lambda g: g.index))
        self.display = bool(self._gpus)  # no GPU (no driver): no empty header either
        if not self.is_mounted:
            return  # fitted to the width it gets: drawn at mount
        if self.mode == COMPACT:
            compact = self._compact_layout()
            n = compact.columns
            self.set_rows([(f"gpu{g.index}", gpu_cells(g, compact.meter_width)[:n]) for g in self._gpus])
            return
        layout = self._full_layout()
        rows = []
        for g in self._gpus:
            first, second = full_lines(g, layout)
            rows.append((f"gpu{g.index}", (first,)))
            rows.append((f"gpu{g.index}+", (second,)))
        self.set_rows(rows)

    def _width(self) -> int:
        # The room beside a vertical scrollbar, whether or not one shows yet: a layout fitted to the
        # width without it would be cut when it appears (a scrollbar is no resize).
        width = self.region.width or self.app.size.width
        return max(0, width - self.styles.scrollbar_size_vertical)

    def _compact_layout(self) -> CompactLayout:
        key = (COMPACT, *layout_key(self._gpus, self._width()))
        if self._layout is None or self._layout[0] != key:
            layout = compact_layout(self._gpus, self._width())
            columns = _COMPACT[: layout.columns]
            if list(self.columns) != columns:
                self.set_columns(columns)
            self._layout = (key, layout)
        assert isinstance(self._layout[1], CompactLayout)
        return self._layout[1]

    def _full_layout(self) -> FullLayout:
        key = (FULL, *layout_key(self._gpus, self._width()))
        if self._layout is None or self._layout[0] != key:
            layout = full_layout(self._gpus, self._width())
            header = full_header(layout)
            if self.columns != (("line", header, "left"),):
                self.set_columns([("line", header, "left")])
            self._layout = (key, layout)
        assert isinstance(self._layout[1], FullLayout)
        return self._layout[1]

    def on_mount(self) -> None:
        self.show(self._gpus)

    def on_resize(self) -> None:
        super().on_resize()
        if self._gpus:
            self.show(self._gpus)
