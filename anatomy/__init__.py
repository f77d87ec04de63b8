"""anatomy: measure where a training step's memory and time go, and publish it to anatomy-top.

``import anatomy`` is cheap and imports neither torch nor transformers: ``track`` and
``AnatomyCallback`` are loaded on first use, and the stdlib-only ``anatomy.vocabulary`` and
``anatomy.protocol`` modules are what the monitor shares.
"""

from __future__ import annotations

# Not ``typing``: the monitor's --once imports this package (for anatomy.rundir) and must stay cheap.
TYPE_CHECKING = False

__all__ = ["AnatomyCallback", "Tracker", "track"]

if TYPE_CHECKING:
    from anatomy.hook.callback import AnatomyCallback
    from anatomy.hook.tracker import Tracker, track


def __getattr__(name: str) -> object:
    if name in ("track", "Tracker"):
        from anatomy.hook import tracker

        return getattr(tracker, name)
    if name == "AnatomyCallback":
        from anatomy.hook.callback import AnatomyCallback

        return AnatomyCallback
    raise AttributeError(f"module 'anatomy' has no attribute {name!r}")
