"""The project's layering rules, checked by importing every module in a fresh interpreter:
the monitor never imports torch, the hook never imports textual, the data layer, the exporter and the
reports never import the Textual app, and `import anatomy` stays cheap."""

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


# The data layer, the exporter and the reports (--once text and JSON, the run report's HTML/PNG) run without
# a terminal app: none of them imports the Textual app, its widgets or Textual. tui.replay is not among them:
# it is a Textual app itself (the monitor's anatomy pane over a recorded run).
WITHOUT_THE_APP = {
    "tui.sources": "tui.sources.nvml",
    "tui.simnvml": "tui.simnvml.library",
    "tui.exporter": "tui.exporter.collector",
    "tui.report": "tui.report.smi_text",
    "tui.runreport": "tui.runreport.page",
}


@pytest.mark.parametrize("package", sorted(WITHOUT_THE_APP))
def test_package_never_imports_the_app(package: str) -> None:
    modules = [m for m in _modules("tui") if m == package or m.startswith(package + ".")]
    assert WITHOUT_THE_APP[package] in modules  # the walk found the package
    assert _loaded_after_import(modules, ("textual", "tui.widgets", "tui.app")) == []


@pytest.mark.parametrize("module", ["anatomy", "anatomy.protocol", "anatomy.vocabulary", "anatomy.advisor"])
def test_import_anatomy_is_cheap(module: str) -> None:
    assert _loaded_after_import([module], ("torch", "transformers", "textual")) == []
