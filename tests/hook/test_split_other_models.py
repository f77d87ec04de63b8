"""What was in use at a step's start is divided with the other models named: inputs, communication
buffers and other models' weights first, then the runtime baseline, the rest unattributed; the split of
the peak carries the other-models row and still sums to the peak."""

from __future__ import annotations

from anatomy.hook.held import Held
from anatomy.hook.split import divide_preexisting, split_peak
from anatomy.vocabulary import Component


def test_other_models_come_before_the_runtime_and_unattributed() -> None:
    pre = divide_preexisting(1000, inputs=100, runtime=500, communication=50, other_models=300)
    assert (pre.inputs, pre.communication, pre.other_models, pre.runtime, pre.unattributed) == (
        100,
        50,
        300,
        500,
        50,
    )
    assert pre.inputs + pre.communication + pre.other_models + pre.runtime + pre.unattributed == 1000


def test_what_the_start_cannot_hold_is_capped_in_order() -> None:
    pre = divide_preexisting(200, inputs=100, runtime=500, communication=0, other_models=300)
    assert (pre.inputs, pre.other_models, pre.runtime, pre.unattributed) == (100, 100, 0, 0)


def test_the_split_names_other_models_and_sums_to_the_peak() -> None:
    pre = divide_preexisting(1000, inputs=0, runtime=600, other_models=300)
    held = Held(activations=2000, gradients=400, optimizer_states=800)
    out, excess = split_peak(10_000, 400, held, pre, runtime=True, others=True)
    assert excess == 0
    assert out[Component.OTHER_MODELS.value] == 300
    assert out[Component.RUNTIME.value] == 600 and out[Component.UNATTRIBUTED.value] == 100
    assert sum(v or 0 for v in out.values()) == 10_000
    # no other model registered: no row
    out, _ = split_peak(10_000, 400, held, divide_preexisting(1000, 0, 600), runtime=True)
    assert Component.OTHER_MODELS.value not in out and sum(v or 0 for v in out.values()) == 10_000


def test_an_excess_comes_off_unattributed_and_runtime_before_other_models() -> None:
    pre = divide_preexisting(1000, inputs=0, runtime=600, other_models=300)
    out, excess = split_peak(3_000, 400, Held(activations=2000), pre, runtime=True, others=True)
    assert excess == 400 + 2000 + 600 + 300 + 100 - 3_000  # weights, activations and the start: 400 over
    assert sum(v or 0 for v in out.values()) == 3_000
    assert out[Component.OTHER_MODELS.value] == 300  # named tensors are taken last
    assert out[Component.UNATTRIBUTED.value] == 0 and out[Component.TEMPORARIES.value] == 0
