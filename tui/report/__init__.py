"""Plain reports of a machine snapshot: nvidia-smi-style text and the ``--once --json`` document."""

from __future__ import annotations

from tui.report.once_json import SCHEMA, SCHEMA_VERSION, render_json
from tui.report.smi_text import render_text

__all__ = ["SCHEMA", "SCHEMA_VERSION", "render_json", "render_text"]
