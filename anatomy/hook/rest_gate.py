"""What a resting step reads (:mod:`anatomy.hook.resting`), in one small object."""

from __future__ import annotations

from typing import Any

import torch

from anatomy.hook.lean import REST_NEVER

# Either state of the probe's gradient gives the build's gradients at a step's start (none were summed).
ANY_GRAD = 2


def no_parameter() -> torch.Tensor | None:
    return None


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
        "samples",
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
        self.samples: int | None = None  # the build's; a resting step's own, or the default, must equal it
        self.default_samples: int | None = None
        # The look's blocks (gradient accumulation: micro-batches in blocks of their own), each told
        # ``block_samples`` (its share of ``samples``), and the forwards of each (a step of one block may
        # run several: a resting step's run unseen).
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
