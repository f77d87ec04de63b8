"""The one guard: a failure inside a feature's section is logged once, remembered, and turns only that
feature off; what is not an ``Exception`` (Ctrl-C) passes through untouched."""

from __future__ import annotations

import logging

import pytest

from anatomy.hook.guard import MAX_TEXT, Feature, Guard


def test_a_failure_turns_its_feature_off_once(caplog: pytest.LogCaptureFixture) -> None:
    guard = Guard()
    ran_after = []
    with caplog.at_level(logging.WARNING, logger="anatomy"):
        for _ in range(3):
            with guard(Feature.GRADIENTS):
                raise RuntimeError("walk exploded")
            ran_after.append(True)  # the statement after the block still runs
    assert ran_after == [True] * 3
    assert not guard.ok(Feature.GRADIENTS) and guard.ok(Feature.HEAP)
    assert guard.error == "gradients: RuntimeError: walk exploded"
    assert sum("walk exploded" in r.getMessage() for r in caplog.records) == 1


def test_errors_join_and_are_capped() -> None:
    guard = Guard()
    with guard(Feature.HEAP):
        raise ValueError("x" * (2 * MAX_TEXT))
    guard.turn_off(Feature.PUBLISH, "the socket could not be opened")
    assert not guard.all_ok(Feature.HEAP, Feature.CUDA)
    assert guard.error is not None and len(guard.error) == MAX_TEXT


def test_keyboard_interrupt_is_not_swallowed() -> None:
    guard = Guard()
    with pytest.raises(KeyboardInterrupt), guard(Feature.STEP):
        raise KeyboardInterrupt
    assert guard.ok(Feature.STEP) and guard.error is None


def test_a_clean_section_changes_nothing() -> None:
    guard = Guard()
    with guard(Feature.TIMING):
        pass
    assert guard.ok(Feature.TIMING) and guard.error is None
