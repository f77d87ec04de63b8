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
    for info in pkgutil.walk_packages([str(ROOT.joinpath(*package.split(".")))], prefix=f"{package}."):
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
    data_layer = ("tui.sources", "tui.simnvml", "tui.report", "tui.exporter", "tui.view")
    modules = [m for m in _modules("tui") if m.startswith(data_layer)]
    assert "tui.sources.nvml" in modules and "tui.exporter.collector" in modules
    assert "tui.view.poll" in modules and "tui.view.anatomy" in modules
    assert _loaded_after_import(modules, ("textual", "tui.widgets", "tui.app", "torch")) == []


def test_view_layer_imports_no_textual_nor_torch() -> None:
    """The poll worker computes what the panes show with the view layer alone: no widget toolkit."""
    modules = _modules("tui.view")
    assert "tui.view.process_rows" in modules
    assert _loaded_after_import(modules, ("textual", "torch", "transformers", "tui.widgets")) == []


@pytest.mark.parametrize("module", ["anatomy", "anatomy.protocol", "anatomy.vocabulary", "anatomy.advisor"])
def test_import_anatomy_is_cheap(module: str) -> None:
    assert _loaded_after_import([module], ("torch", "transformers", "textual")) == []
