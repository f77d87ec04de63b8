"""The arithmetic of a step's anatomy: what the named tensors explain of a phase's growth, what they hold
at a phase's peak, and the split of the peak into components that sums to the peak exactly."""

from __future__ import annotations

from anatomy.hook.held import Held
from anatomy.hook.record import Preexisting, StepParts, StepRecord, Sums, Traced
from anatomy.hook.trace import MemoryTrace
from anatomy.vocabulary import Component, Phase


def step_parts(rec: StepRecord, sums: Sums) -> StepParts:
    """Bytes of the named tensors of a step (the last counts where this step did not count)."""
    counted = rec.activations is not None
    acts = rec.activations if counted else sums.activations
    copies = rec.weight_copies if counted else sums.weight_copies
    grads = rec.grads if rec.grads is not None else sums.gradients
    opt = rec.opt_after if rec.opt_after is not None else sums.optimizer_states
    return StepParts(
        activations=acts or 0,
        weight_copies=copies,
        gradients=grads,
        optimizer_states=opt,
        new_gradients=max(grads - rec.grads_begin, 0),
        new_states=max(opt - rec.opt_begin, 0),
        at_start=sums.weights + rec.opt_begin + rec.grads_begin,
        activations_known=acts is not None,
        inputs=rec.inputs if counted else sums.inputs,
    )


def divide_preexisting(
    preexisting: int, inputs: int, runtime: int | None, communication: int = 0, other_models: int = 0
) -> Preexisting:
    """Split what was in use at the step's start (beyond weights, states, gradients): the inputs first,
    communication buffers and other models' weights (named tensors), then the runtime baseline, and the
    rest is unattributed."""
    pre = max(preexisting, 0)
    inputs_part = min(max(inputs, 0), pre)
    comm_part = min(max(communication, 0), pre - inputs_part)
    others_part = min(max(other_models, 0), pre - inputs_part - comm_part)
    runtime_part = min(max(runtime or 0, 0), pre - inputs_part - comm_part - others_part)
    rest = pre - inputs_part - comm_part - others_part - runtime_part
    return Preexisting(inputs_part, runtime_part, rest, comm_part, others_part)


def explained(rec: StepRecord, phase: Phase, parts: StepParts) -> int:
    """What named tensors account for of a phase's peak growth above the step's start. In backward,
    activations are freed as gradients appear: the larger of the two is held."""
    held = parts.activations + parts.weight_copies
    if phase is Phase.FORWARD:
        return held + (parts.new_gradients if rec.micro > 1 else 0)
    if phase is Phase.BACKWARD:
        return max(held, parts.new_gradients)
    # The optimizer phase, and after it (zero_grad, the step's end): gradients and new states.
    return parts.new_gradients + parts.new_states


def explained_after_optimizer(rec: StepRecord) -> int:
    grads = max((rec.grads or 0) - rec.grads_begin, 0)
    states = max((rec.opt_after if rec.opt_after is not None else rec.opt_begin) - rec.opt_begin, 0)
    return grads + states


def held_after_optimizer(rec: StepRecord, sums: Sums) -> Held:
    """Held after the optimizer (or at a step's end without one): gradients and states, no activations."""
    grads = rec.grads if rec.grads is not None else sums.gradients
    opt = rec.opt_after if rec.opt_after is not None else sums.optimizer_states
    return Held(gradients=grads, optimizer_states=opt)


def held_in_phase(rec: StepRecord, phase: Phase, parts: StepParts) -> Held:
    """Without a per-op trace: what is held at a phase's peak. In forward and early backward (where a
    backward peak lies: the activations not yet freed, the first gradients being made) the activations
    are all held; after backward, gradients and the optimizer's states."""
    if phase in (Phase.FORWARD, Phase.BACKWARD):
        earlier = parts.new_gradients if rec.micro > 1 else 0
        return Held(parts.activations, parts.weight_copies, rec.grads_begin + earlier, rec.opt_begin)
    return Held(gradients=parts.gradients, optimizer_states=parts.optimizer_states)


def traced_split(
    rec: StepRecord, trace: MemoryTrace, start: int, parts: StepParts, opt_now: int
) -> Traced | None:
    """What a finished per-op trace says about its step: the highest phase, its temporaries and the
    named tensors held at that moment. None when the trace saw nothing usable."""
    if trace.failed or not trace.peaks:
        return None
    growth = [(ph, peak - start) for ph, peak in trace.peaks.items()]
    phase, top = max(growth, key=lambda g: g[1])
    temporaries = max(max(g - explained(rec, ph, parts) for ph, g in growth), 0)
    moment = trace.moments[phase].held
    in_step = phase in (Phase.FORWARD, Phase.BACKWARD)
    opt = rec.opt_begin if in_step else (rec.opt_after if rec.opt_after is not None else opt_now)
    held = Held(moment.activations, moment.weight_copies, moment.gradients, opt)
    return Traced(rec.index, max(top, 0), phase, temporaries, held)


_BALANCE_ORDER = (
    Component.UNATTRIBUTED,
    Component.RUNTIME,
    Component.COMMUNICATION_BUFFERS,
    Component.OTHER_MODELS,
    Component.INPUTS,
    Component.ACTIVATIONS,
    Component.GRADIENTS,
    Component.OPTIMIZER_STATES,
    Component.WEIGHTS,
)


def split_peak(
    peak: int,
    weights: int,
    held: Held,
    pre: Preexisting,
    runtime: bool = False,
    others: bool = False,
) -> tuple[dict[Component, int | None], int]:
    """The peak split into what each component held at its moment, summing to the peak, and the excess
    taken off (0 where the named tensors fit).

    What was in use at the step's start beyond weights, optimizer states and gradients (inputs, the
    runtime baseline, unattributed) is constant through the step; temporaries are the rest of the peak.
    If the named tensors and the rest exceed the peak (a trace from an earlier step, gradients freed
    before the reading), temporaries are 0 and the excess comes off unattributed first, so the sum
    holds. ``runtime``: the split has a runtime row (CPU); ``others``: an other-models row (models
    registered besides the trained one)."""
    out: dict[Component, int] = {
        Component.WEIGHTS: weights + held.weight_copies,
        Component.OPTIMIZER_STATES: held.optimizer_states,
        Component.GRADIENTS: held.gradients,
        Component.ACTIVATIONS: held.activations,
        Component.UNATTRIBUTED: pre.unattributed,
    }
    if pre.inputs:
        out[Component.INPUTS] = pre.inputs
    if pre.communication:
        out[Component.COMMUNICATION_BUFFERS] = pre.communication
    if runtime:
        out[Component.RUNTIME] = pre.runtime
    if others or pre.other_models:
        out[Component.OTHER_MODELS] = pre.other_models
    rest = peak - sum(out.values())
    excess = max(-rest, 0)
    if rest < 0:
        left = excess
        for key in _BALANCE_ORDER:
            if key not in out:
                continue
            take = min(left, out[key])
            out[key] -= take
            left -= take
        rest = 0
    out[Component.TEMPORARIES] = rest
    return dict(out), excess
