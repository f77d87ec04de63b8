"""Prometheus' text format (0.0.4) and OpenMetrics 1.0 (what Prometheus asks for), written byte for byte as
prometheus_client's ``generate_latest`` functions write them, at a third of their cost.

prometheus_client validates and escapes every label name of every sample (~5 µs a sample); a scrape of a
busy node has ~700 samples, and that was most of what a scrape cost. Here a family's label names are
checked once per distinct set, and values are escaped only when they hold a character that needs it.
Anything this writer does not cover as plain gauges and counters (histograms, summaries, OpenMetrics-only
samples such as ``_created``, names outside the legacy character set) is handed to prometheus_client, one
family at a time, so the output is always what it would write.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from prometheus_client import generate_latest as _client_generate_latest
from prometheus_client.openmetrics import exposition as _openmetrics
from prometheus_client.utils import floatToGoString

_LEGACY_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LEGACY_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_SIMPLE_TYPES = {"gauge": "gauge", "counter": "counter", "unknown": "untyped"}


class _One:
    """A collector of one family, for prometheus_client's own writer."""

    def __init__(self, metric: Any) -> None:
        self._metric = metric

    def collect(self) -> list[Any]:
        return [self._metric]


def _escape_value(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_openmetrics_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _family(metric: Any, out: list[str], openmetrics: bool = False) -> bool:
    """Write ``metric``; False (nothing written) where prometheus_client must write it."""
    mtype = _SIMPLE_TYPES.get(metric.type)
    name = metric.name
    if mtype is None or not _LEGACY_NAME.match(name) or bool(getattr(metric, "unit", None)):
        return False
    sample_name = name + "_total" if metric.type == "counter" else name
    for s in metric.samples:
        if (
            s.name != sample_name
            or s.timestamp is not None
            or s.exemplar is not None
            or getattr(s, "native_histogram", None) is not None
        ):
            return False
    if openmetrics:  # the family's own name, its own type; quotes escaped in the help too
        lines = [
            f"# HELP {name} {_escape_openmetrics_help(metric.documentation)}\n",
            f"# TYPE {name} {metric.type}\n",
        ]
    else:  # counters are named with their _total, and "unknown" is "untyped"
        lines = [
            f"# HELP {sample_name} {_escape_help(metric.documentation)}\n",
            f"# TYPE {sample_name} {mtype}\n",
        ]
    checked: set[tuple[str, ...]] = set()
    for s in metric.samples:
        labels = s.labels
        if labels:
            keys = tuple(sorted(labels))
            if keys not in checked:
                if not all(_LEGACY_LABEL.match(k) for k in keys):
                    return False
                checked.add(keys)
            text = ",".join(f'{k}="{_escape_value(labels[k])}"' for k in keys)
            lines.append(f"{s.name}{{{text}}} {floatToGoString(s.value)}\n")
        else:
            lines.append(f"{s.name} {floatToGoString(s.value)}\n")
    out.extend(lines)
    return True


def generate_latest(registry: Any) -> bytes:
    """What ``prometheus_client.generate_latest(registry)`` returns, for the default escaping."""
    out: list[str] = []
    metrics: Iterable[Any] = registry.collect()
    for metric in metrics:
        if not _family(metric, out):
            out.append(_client_generate_latest(_One(metric)).decode("utf-8"))  # type: ignore[arg-type]
    return "".join(out).encode("utf-8")


# Escaping schemes under which legacy names are written as they are (DOTS and VALUES rewrite them).
_NAMES_AS_THEY_ARE = (_openmetrics.UNDERSCORES, _openmetrics.ALLOWUTF8)
_EOF = "# EOF\n"


def generate_latest_openmetrics(
    registry: Any, escaping: str = _openmetrics.UNDERSCORES, version: str = "1.0.0"
) -> bytes:
    """What ``prometheus_client.openmetrics.exposition.generate_latest(registry, escaping, version)``
    returns."""
    out: list[str] = []
    for metric in registry.collect():
        if escaping not in _NAMES_AS_THEY_ARE or not _family(metric, out, openmetrics=True):
            text = _openmetrics.generate_latest(_One(metric), escaping=escaping, version=version).decode(
                "utf-8"
            )
            out.append(text[: -len(_EOF)] if text.endswith(_EOF) else text)
    out.append(_EOF)
    return "".join(out).encode("utf-8")
