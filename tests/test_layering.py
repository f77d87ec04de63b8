"""The project's layering rules, checked by importing every module in a fresh interpreter:
the monitor never imports torch, the hook never imports textual, the data layer, the exporter and the
reports never import the Textual app, and `import anatomy` stays cheap."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from collections.abc import Iterable
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


# The data layer, the exporter and the reports (--once text and JSON, the run report's HTML/PNG) run without
# a terminal app: none of them imports the Textual app, its widgets or Textual. tui.replay is not among them:
# it is a Textual app itself (the monitor's anatomy pane over a recorded run).
WITHOUT_THE_APP = {
    "tui.sources": "tui.sources.nvml",
    "tui.simnvml": "tui.simnvml.library",
    "tui.exporter": "tui.exporter.collector",
    "tui.report": "tui.report.smi_text",
    "tui.runreport": "tui.runreport.page",
    "tui.view": "tui.view.poll",
}


@pytest.mark.parametrize("package", sorted(WITHOUT_THE_APP))
def test_package_never_imports_the_app(package: str) -> None:
    modules = [m for m in _modules("tui") if m == package or m.startswith(package + ".")]
    assert WITHOUT_THE_APP[package] in modules  # the walk found the package
    assert _loaded_after_import(modules, ("textual", "tui.widgets", "tui.app", "torch")) == []


def test_view_layer_imports_no_textual_nor_torch() -> None:
    """The poll worker computes what the panes show with the view layer alone: no widget toolkit."""
    modules = _modules("tui.view")
    assert "tui.view.process_rows" in modules
    assert _loaded_after_import(modules, ("textual", "torch", "transformers", "tui.widgets")) == []


@pytest.mark.parametrize("module", ["anatomy", "anatomy.protocol", "anatomy.vocabulary", "anatomy.advisor"])
def test_import_anatomy_is_cheap(module: str) -> None:
    assert _loaded_after_import([module], ("torch", "transformers", "textual")) == []


# Import circles among our own modules: a static walk of every ``import`` and ``from … import``, those
# inside functions included (a deferred import still ties the two modules together), those under
# ``if TYPE_CHECKING:`` left out (they never run). Each set is one circle's modules.
KNOWN_CIRCLES: set[frozenset[str]] = set()  # none: a new circle is a design question, not an exemption
# (anatomy.hook.record -> trace is a TYPE_CHECKING import only: no circle at run time.)


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(nodes: Iterable[ast.AST]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                walk(node.orelse)
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            walk(ast.iter_child_nodes(node))

    walk([tree])
    return found


def import_graph(packages: tuple[str, ...] = ("anatomy", "tui")) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports."""
    files = {_module_of(p): p for package in packages for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1 more
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in files else base)
        graph[module] = {t for t in targets if t in files and t != module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected sets of two or more modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.add(member)
                if member == node:
                    break
            if len(members) > 1:
                circles.add(frozenset(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_the_circle_finder_finds_a_circle_and_skips_type_checking_imports() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_circles(graph) == {frozenset({"a", "b", "c"})}
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nelse:\n    import y\n"
        "def f():\n    import z\n"
    )
    names = sorted(alias.name for node in _imports(tree) for alias in node.names)
    assert names == ["TYPE_CHECKING", "y", "z"]


def test_no_import_circles_among_our_modules() -> None:
    graph = import_graph()
    assert "tui.app" in graph and "tui.selection" in graph["tui.app"]  # the walk found the imports
    circles = import_circles(graph)
    assert circles - KNOWN_CIRCLES == set(), sorted(sorted(c) for c in circles - KNOWN_CIRCLES)



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


# Small modules whose names say what they hold: no product file over MAX_LINES. The NVML simulator's
# symbol table is one list of the library's entry points and stays whole.
MAX_LINES = 500
LONG_FILES_ALLOWED = {
    "tui/simnvml/library.py",
}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_product_file_exceeds_the_line_limit() -> None:
    files = [p for package in ("anatomy", "tui") for p in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 100  # the walk found the packages
    too_long = {
        str(p.relative_to(ROOT)): n
        for p in files
        if (n := _lines(p)) > MAX_LINES and str(p.relative_to(ROOT)) not in LONG_FILES_ALLOWED
    }
    assert too_long == {}, f"over {MAX_LINES} lines: split them ({too_long})"

