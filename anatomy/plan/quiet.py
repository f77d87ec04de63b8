"""Quiet while the plan builds and runs a model: transformers' log below ERROR and Python's warnings,
which would speak of a model the plan builds only to measure it. Stdlib only, so that every module of
the plan can use it without importing the fake step."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    tlog = logging.getLogger("transformers")
    level = tlog.level
    tlog.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tlog.setLevel(level)


__all__ = ["warnings_off"]
