"""The monitor's one-line texts around the tables: the errors line, the pane tabs (one pane at a time
below the wide layout) and the process bar (counts, sort, filters). Pure: the app shows them."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

PANE_NVSMI, PANE_ANATOMY = "nvsmi", "anatomy"  # the two panes, as the tabs and the #body class name them
PANE_LABELS: tuple[tuple[str, str], ...] = ((PANE_NVSMI, "nvidia-smi"), (PANE_ANATOMY, "anatomy"))


def status_text(errors: Sequence[str]) -> Text:
    text = Text()
    for i, error in enumerate(errors):
        if i:
            text.append("\n")
        text.append("error ", style="bold red")
        text.append(Text(error))
    return text


def pane_tabs_text(pane: str) -> Text:
    text = Text()
    for name, label in PANE_LABELS:
        style = "bold reverse cyan" if pane == name else "bright_black"
        text.append(f" {label} ", style=style)
        text.append(" ")
    text.append(" tab switches", style="bright_black")
    return text


def proc_bar_text(
    shown: int, total: int, publishing: int, sort_label: str, only: str | None, filter_text: str
) -> Text:
    """``only``: what --only/--user/--pid and u/g/P keep, None when they keep everything;
    ``filter_text``: what the / line filters on."""
    text = Text("Processes ", style="bold")
    text.append(f"{shown}" if shown == total else f"{shown} of {total}")
    if publishing:
        text.append(f" · {publishing} publishing ◆", style="green")
    text.append(f" · sort {sort_label}", style="bright_black")
    if only is not None:
        text.append(" · only ", style="bright_black")
        text.append(only, style="yellow")
    if filter_text:
        text.append(" · filter ", style="bright_black")
        text.append(Text(repr(filter_text), style="yellow"))
    return text


__all__ = ["PANE_ANATOMY", "PANE_LABELS", "PANE_NVSMI", "pane_tabs_text", "proc_bar_text", "status_text"]
