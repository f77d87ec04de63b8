"""The project's layering rules, checked by importing every module in a fresh interpreter:
the monitor never imports torch, the hook never imports textual, the data layer knows no widgets,
and `import anatomy` stays cheap."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The demo's training job runs in its own process and is the one tui module allowed to import torch.
TORCH_ALLOWED_IN_TUI = {"tui.demo_train"}


def _modules(package: str) -> list[str]:
    names = [package]
    for info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
        names.append(info.name)
    return sorted(names)


def _loaded_after_import(modules: list[str], watch: tuple[str, ...]) -> list[str]:
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"print(' '.join(w for w in {watch!r} if w in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.split()


def test_monitor_never_imports_torch() -> None:
    modules = [m for m in _modules("tui") if m not in TORCH_ALLOWED_IN_TUI]
    assert len(modules) > 20  # the walk found the package
    assert _loaded_after_import(modules, ("torch", "transformers")) == []


def test_hook_never_imports_textual() -> None:
    modules = _modules("anatomy")
    assert "anatomy.hook.tracker" in modules and "anatomy.hook.callback" in modules
    assert _loaded_after_import(modules, ("textual",)) == []


def test_data_layer_knows_no_widgets() -> None:
    data_layer = ("tui.sources", "tui.simnvml", "tui.report", "tui.exporter")
    modules = [m for m in _modules("tui") if m.startswith(data_layer)]
    assert "tui.sources.nvml" in modules and "tui.exporter.collector" in modules
    assert _loaded_after_import(modules, ("textual", "tui.widgets", "tui.app")) == []


@pytest.mark.parametrize("module", ["anatomy", "anatomy.protocol", "anatomy.vocabulary", "anatomy.advisor"])
def test_import_anatomy_is_cheap(module: str) -> None:
    assert _loaded_after_import([module], ("torch", "transformers", "textual")) == []



# The wire's own words come from the vocabulary, and its runtime directory from the stdlib-only rundir
# (kept outside the package: the monitor's --once pre-check imports it alone, without the wire's ~15 ms).
WIRE_MAY_IMPORT = {"anatomy", "anatomy.vocabulary", "anatomy.rundir"}
_WIRE_DIR = str(ROOT / "anatomy" / "protocol")
WIRE = ["anatomy.protocol", *sorted(i.name for i in pkgutil.walk_packages([_WIRE_DIR], "anatomy.protocol."))]


def test_the_wire_package_is_found() -> None:
    assert {"anatomy.protocol.codec", "anatomy.protocol.reader", "anatomy.protocol.publisher"} <= set(WIRE)


@pytest.mark.parametrize("module", [*WIRE, "anatomy.rundir", "anatomy.vocabulary"])
def test_the_wire_imports_nothing_of_ours_but_the_vocabulary(module: str) -> None:
    """Each module alone, in a fresh interpreter: what it pulls in of ``anatomy.*`` and ``tui.*``."""
    code = (
        "import importlib, sys\n"
        f"importlib.import_module({module!r})\n"
        "print(' '.join(m for m in sys.modules if m.split('.')[0] in ('anatomy', 'tui')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    loaded = out.stdout.split()
    assert module in loaded
    ours = {m for m in loaded if m != "anatomy.protocol" and not m.startswith("anatomy.protocol.")}
    assert ours <= WIRE_MAY_IMPORT, sorted(ours - WIRE_MAY_IMPORT)
