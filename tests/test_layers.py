"""The layers stay visible: the wire library imports nothing above it, and nothing below the tools imports them.

logjam/ (wire library) <- runtime/ (flags, health, --check) <- devices/, bridges/, table/ (the messages
table's rules) <- importer/ (logjam-importer), warehouse/ (logjam-spark and its maintenance) <- tools/.
importer/ and warehouse/ share the table through table/ and never import each other. harness/ serves
tests/ and benchmarks/, which never import each other, and nothing of the product imports any of them. No module takes
part in an import cycle, not even through an import inside a function.
Checked on the source with `ast`, so a stray import fails here, not in a code review.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.processes import REPO

# What tests and benchmarks run on: the product never imports it, and harness/ (shared by both)
# imports neither of them, so that tests and benchmarks never import each other either.
TEST_SIDE = {"harness", "tests", "benchmarks"}
ABOVE = {
    "logjam": {"runtime", "devices", "bridges", "table", "importer", "warehouse", "tools", *TEST_SIDE},
    "runtime": {"devices", "bridges", "table", "importer", "warehouse", "tools", *TEST_SIDE},
    "devices": {"bridges", "table", "importer", "warehouse", "tools", *TEST_SIDE},
    "bridges": {"devices", "table", "importer", "warehouse", "tools", *TEST_SIDE},
    "table": {"devices", "bridges", "importer", "warehouse", "tools", *TEST_SIDE},
    "importer": {"devices", "bridges", "warehouse", "tools", *TEST_SIDE},
    "warehouse": {"devices", "bridges", "importer", "tools", *TEST_SIDE},
    "tools": TEST_SIDE,
    "harness": {"tests", "benchmarks"},
    "benchmarks": {"tests"},
    "tests": {"benchmarks"},
}
# Every first-party package of the product: the import-cycle check covers all of their modules.
PACKAGES = [p for p in ABOVE if p not in TEST_SIDE]


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


def module_names(root: Path, packages: list[str]) -> dict[str, Path]:
    """Every module below `root` in `packages`, by its dotted name (a package by its own name)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The first-party modules `name` imports anywhere in its body: at the top, inside functions,
    under TYPE_CHECKING, or by a literal name given to importlib.import_module or __import__."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def deepest(dotted: str) -> str | None:
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in known:
                return ".".join(parts[:n])
        return None

    out: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {deepest(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else deepest(base))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.add(deepest(arg.value))
    return {m for m in out if m is not None and m != name}


def import_cycles(root: Path, packages: list[str]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a loop (Tarjan's strongly connected components)."""
    modules = module_names(root, packages)
    graph = {name: imported_modules(name, path, set(modules)) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(cycles)


def test_no_module_takes_part_in_an_import_cycle() -> None:
    assert import_cycles(REPO, PACKAGES) == []


def test_the_cycle_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The cycle checker itself can fail: a pair that meets only through a function-level import."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n    return b\n")
    (pkg / "b.py").write_text("import pkg.a\n")
    (pkg / "c.py").write_text("from . import a\nfrom .b import something\n")
    (pkg / "d.py").write_text("import importlib\nimportlib.import_module('pkg.e')\n")
    (pkg / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import x\n")
    assert import_cycles(tmp_path, ["pkg"]) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.e"]]
