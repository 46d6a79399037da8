"""The layers stay visible: the wire library imports nothing above it, and nothing below the tools imports them.

logjam/ (wire library) <- runtime/ (flags, health, --check) <- devices/, bridges/, importer/ <- tools/.
Checked on the source with `ast`, so a stray import fails here, not in a code review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO

ABOVE = {
    "logjam": {"runtime", "devices", "bridges", "importer", "tools"},
    "runtime": {"devices", "bridges", "importer", "tools"},
    "devices": {"bridges", "importer", "tools"},
    "bridges": {"devices", "importer", "tools"},
    "importer": {"devices", "bridges", "tools"},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level packages `path` imports: import statements, and importlib.import_module or
    __import__ called with a literal name (a loader that names an upper layer's module in a
    string depends on that layer as much as an import statement does)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            name = node.args[0]
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                out.add(name.value.split(".")[0])
    return out


def _is_dynamic_import(func: ast.expr) -> bool:
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_a_layer_imports_nothing_above_it(package: str) -> None:
    wrong = {}
    for path in sorted((REPO / package).rglob("*.py")):
        bad = imported_packages(path) & ABOVE[package]
        if bad:
            wrong[str(path.relative_to(REPO))] = sorted(bad)
    assert not wrong, f"{package}/ imports layers above it: {wrong}"


def test_the_check_sees_imports_by_name(tmp_path: Path) -> None:
    """The checker itself can fail: every spelling of an import it must catch."""
    src = tmp_path / "m.py"
    src.write_text("import bridges.host\nfrom devices import cli\nimport importlib\n"
                   "importlib.import_module('tools.mesh')\n__import__('importer')\nfrom . import sibling\n")
    assert imported_packages(src) == {"bridges", "devices", "importlib", "tools", "importer"}


def test_the_wire_library_loads_no_upper_layer_module_by_name() -> None:
    """logjam/native.py imports C modules by name; the names come from its callers, never from logjam/."""
    upper = tuple(f"{p}." for p in ABOVE["logjam"])
    found = {}
    for path in sorted((REPO / "logjam").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr)}
        names = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and id(n) not in docstrings and n.value.startswith(upper)]
        if names:
            found[str(path.relative_to(REPO))] = names
    assert not found, f"logjam/ names modules of the layers above it: {found}"
