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
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("package", sorted(ABOVE))
def test_a_layer_imports_nothing_above_it(package: str) -> None:
    wrong = {}
    for path in sorted((REPO / package).rglob("*.py")):
        bad = imported_packages(path) & ABOVE[package]
        if bad:
            wrong[str(path.relative_to(REPO))] = sorted(bad)
    assert not wrong, f"{package}/ imports layers above it: {wrong}"
