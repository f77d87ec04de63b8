"""The training-side hook, by responsibility.

``tracker`` (the :class:`Tracker` and ``track``: the step's life cycle), built in layers over
``tracker_state`` (its state, declared once): ``attach`` (set-up, sums, device, what it detects),
``sampled`` (the sampled step's instruments), ``phases`` (the phase hooks), ``framework`` (a framework's
calls: Lightning's forward, a backward's end), ``snapshots`` (a finished
step's snapshot and publishing) and ``ordinary`` (how a step begins; an ordinary step's O(1) end, a row
in :mod:`anatomy.step_feed`), with ``assembly`` (pure: a step record to its memory result and snapshot)
and ``step_context`` (``with tracker.step():``, the wrapped closure); ``schedule``
(what runs on which step), ``record`` (the typed records passed between the parts) and ``held`` (what the
named tensors hold at a moment, a leaf both ``record`` and ``trace`` import), ``guard`` (a failed
feature becomes unmeasured, in one place), ``tensors`` (exact sums of weights, gradients and optimizer
states), ``saved`` (activations through saved-tensor hooks) with ``saved_values`` (what it asks of
values, tensors and the autograd graph), ``gradients`` (gradients alive during a
traced step), ``backend`` with ``heap`` and ``cuda`` (a step's peak on CPU and CUDA), ``trace`` (the
per-op memory trace of a sampled step), ``split`` (the arithmetic of the peak's split), ``timing`` and
``throughput`` (phase times, rates), ``opgroups`` (FLOPs and time per operation group), ``detect``
(precision, optimizer, OOM), ``distributed`` (what DDP's reducer holds), ``hello`` (with
``adapters``: a PEFT model's LoRA adapter) and ``publishing`` (what goes to the monitor) with
``record_only`` (the flight recorder where nothing publishes), ``callback`` (the Hugging Face Trainer way
in), and ``trainer_logs`` and ``lightning_logs`` (the anatomy in the Trainer's and Lightning's loggers).
"""

from __future__ import annotations

from anatomy.hook.schedule import SAMPLE_EVERY, TRACE_EVERY, WARMUP_REFRESH_STEPS
from anatomy.hook.tracker import Tracker, hook_disabled, track

__all__ = ["SAMPLE_EVERY", "TRACE_EVERY", "WARMUP_REFRESH_STEPS", "Tracker", "hook_disabled", "track"]
