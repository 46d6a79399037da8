"""The directories of the table on a local disk: walking its importer roots and partition dirs, their data files.

A partition `(importer I, app_env A, date D)` has the directory
`<table>/importer=I/app_env=A/date=D/`. What the files in it mean (fresh, compacted, strays,
retired) is the commit protocol's, table/protocol.py; this module only lists and deletes.
Names starting with `_` or `.` are never data: every Spark reader skips them, so the
protocol's bookkeeping (`_compaction.json`, `_compacted-<gen>/`, `_dropping`) is never read as rows.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


def is_data_file(path: Path) -> bool:
    name = path.name
    return not name.startswith(("_", ".")) and path.is_file()


def data_files(directory: Path) -> list[Path]:
    """The files a Spark reader would read directly in `directory` (not in hidden subdirectories)."""
    try:
        return sorted(p for p in directory.iterdir() if is_data_file(p))
    except FileNotFoundError:
        return []


def remove_tree(path: Path) -> int:
    """Delete a directory tree, returning the bytes its files held (0 if it is gone already)."""
    freed = 0
    if not path.exists():
        return 0
    for sub, dirs, files in os.walk(path, topdown=False):
        for name in files:
            p = Path(sub) / name
            with contextlib.suppress(FileNotFoundError):
                freed += p.stat().st_size
                p.unlink()
        for name in dirs:
            with contextlib.suppress(FileNotFoundError):
                (Path(sub) / name).rmdir()
    with contextlib.suppress(FileNotFoundError):
        path.rmdir()
    return freed


def partition_dirs(root: Path) -> Iterator[tuple[str, str, Path]]:
    """(escaped app_env, date, dir) for every partition dir below one importer's root."""
    try:
        app_dirs = sorted(root.iterdir())
    except FileNotFoundError:
        return
    for app_dir in app_dirs:
        if not app_dir.name.startswith("app_env=") or not app_dir.is_dir():
            continue
        for date_dir in sorted(app_dir.iterdir()):
            if date_dir.name.startswith("date=") and date_dir.is_dir():
                yield app_dir.name[len("app_env="):], date_dir.name[len("date="):], date_dir


def importer_roots(table_dir: Path) -> Iterator[tuple[int, Path]]:
    try:
        entries = sorted(table_dir.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith("importer=") and entry.is_dir():
            try:
                yield int(entry.name[len("importer="):]), entry
            except ValueError:
                continue
