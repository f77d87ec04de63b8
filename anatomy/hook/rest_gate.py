"""What a resting step reads (:mod:`anatomy.hook.resting`), in one small object."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import torch

from anatomy.hook.lean import REST_NEVER

# Either state of the probe's gradient gives the build's gradients at a step's start (none were summed).
ANY_GRAD = 2


def no_parameter() -> torch.Tensor | None:
    return None


class StepCount:
    """The witness of an optimizer that keeps its step count as a Python int, moved in its own ``step``
    (bitsandbytes' optimizers, 8-bit and paged: their update writes the parameter through ``p.data`` on the
    CPU and by pointer in a CUDA kernel, so no parameter's version counter moves): the count in its state
    for the probe parameter, read where a tensor's version is read (``_version``; -1: none). Weak
    references only: an optimizer dropped leaves no state held."""

    __slots__ = ("optimizer", "probe")

    def __init__(self, optimizer: Any, probe: torch.Tensor) -> None:
        self.optimizer = weakref.ref(optimizer)
        self.probe = weakref.ref(probe)

    def __call__(self) -> StepCount | None:
        """As a weak reference is called: this witness, while its optimizer and parameter live."""
        return self if self.optimizer() is not None and self.probe() is not None else None

    @property
    def _version(self) -> int:
        optimizer, probe = self.optimizer(), self.probe()
        state = getattr(optimizer, "state", None)
        entry = state.get(probe) if isinstance(state, Mapping) and probe is not None else None
        count = entry.get("step") if isinstance(entry, Mapping) else None
        return count if type(count) is int else -1

    def counts(self, optimizer: Any, probe: torch.Tensor) -> bool:
        """Is this the count of ``optimizer`` for ``probe``?"""
        return self.optimizer() is optimizer and self.probe() is probe


class RestGate:
    """What a resting step's begin reads, set where the last step ended in full (the look): ``ok`` (the REST
    flags; 0: closed), the step count of the next look (``until``), and the last build's figures a resting
    step must share (its samples, its gradients at the start)."""

    __slots__ = (
        "block_samples",
        "blocks",
        "default_samples",
        "grads",
        "key",
        "micro",
        "need_tokens",
        "ok",
        "opt_states",
        "probe",
        "probe_data",
        "regs",
        "start_grads",
        "until",
        "witness",
    )

    def __init__(self) -> None:
        self.ok = REST_NEVER
        self.until = 0
        self.probe: Any = no_parameter  # (a weak reference to the probe parameter)
        self.probe_data = -1
        self.witness: Any = no_parameter  # (a weak reference to the tensor whose version an update moves)
        self.default_samples: int | None = None
        # The look's blocks (gradient accumulation: micro-batches in blocks of their own), each told
        # ``block_samples`` (its share of the build's samples: a resting block's own, or the default, must
        # equal it), and the forwards of each (a step of one block may run several: a resting step's run
        # unseen).
        self.blocks = 1
        self.block_samples: int | None = None
        self.micro = 1
        self.need_tokens = False
        self.grads = ANY_GRAD  # the probe's gradient set (1) or None (0) at the start, as at the build's
        self.start_grads = self.opt_states = 0  # the tracker's sums at a resting step's start
        # The registration watch's dict and key (a private dict where torch keeps none elsewhere).
        self.regs: dict[int, Any] = {}
        self.key = 0

    def close(self) -> None:
        """Steps rest no more until the next look allows it."""
        self.ok = REST_NEVER
