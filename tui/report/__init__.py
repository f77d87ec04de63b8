"""Plain reports of a machine snapshot: nvidia-smi-style text and the ``--once --json`` document.

Names are loaded on first use: ``--once --json`` must not pay for the text renderer, nor text for JSON.
"""

from __future__ import annotations

TYPE_CHECKING = False  # no typing import at run time
if TYPE_CHECKING:
    from typing import Any

    from tui.report.once_json import SCHEMA, SCHEMA_VERSION, render_json
    from tui.report.smi_text import render_text

_WHERE = {
    "SCHEMA": "tui.report.once_json",
    "SCHEMA_VERSION": "tui.report.once_json",
    "render_json": "tui.report.once_json",
    "render_text": "tui.report.smi_text",
}

__all__ = ["SCHEMA", "SCHEMA_VERSION", "render_json", "render_text"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
