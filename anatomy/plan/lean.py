"""Import only what the fake step needs: transformers' optional accelerate and DeepSpeed integrations off.

Building a model from its config imports ``transformers.modeling_utils``, which imports accelerate (and,
through its DeepSpeed integration, accelerate's DeepSpeed utilities) when they are installed: about half a
second of a plan's few seconds, for code that loads checkpoints across devices and trains under DeepSpeed
— nothing a plan runs (it builds the model on the meta device and on fake tensors; its ZeRO figures are its
own arithmetic, :mod:`anatomy.plan.sharding`). transformers works without either package (both are
optional dependencies), and decides through ``is_accelerate_available`` / ``is_deepspeed_available``,
which its modules bind when they are imported: answering False before the first modeling import makes the
process plan as on a machine without them.

Only the ``anatomy-top plan`` process does this (never a library user's process, where the answers would
change what their training does), before it imports any model code; a plan that needs accelerate (a
quantized base model) must not call it. ``ANATOMY_PLAN_LEAN=0`` turns it off.
"""

from __future__ import annotations

import os
import sys

_OFF = ("is_accelerate_available", "is_deepspeed_available")


def lean_imports() -> bool:
    """Answer "not installed" for accelerate and DeepSpeed to transformers; False if it is too late (model
    code already imported) or turned off."""
    if os.environ.get("ANATOMY_PLAN_LEAN", "1") == "0" or "transformers.modeling_utils" in sys.modules:
        return False
    import transformers.utils as tu
    import transformers.utils.import_utils as iu

    def unavailable(*args: object, **kwargs: object) -> bool:
        return False

    for name in _OFF:
        for module in (tu, iu):
            if hasattr(module, name):
                setattr(module, name, unavailable)
    return True


__all__ = ["lean_imports"]
