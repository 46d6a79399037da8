"""Where logjam-mesh keeps its data on this host: the data dir and the default warehouse under it.

The data dir is `$LOGJAM_DATA_DIR`, or `./data` relative to where the process was started
(supervisord starts everything from the repository root, so that is `<repo>/data`).
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "LOGJAM_DATA_DIR"
TABLE = "messages"


def data_dir() -> Path:
    return Path(os.environ.get(DATA_DIR_ENV) or "data").resolve()


def default_warehouse() -> str:
    return str(data_dir() / "warehouse")


def normalise_warehouse(path: str) -> str:
    """Absolute local paths stay usable when handed to a Spark server started elsewhere; URLs pass through."""
    if "://" in path or path.startswith("file:"):
        return path.rstrip("/")
    return str(Path(path).expanduser().resolve())


def table_path(warehouse: str) -> str:
    """The whole `messages` table: every importer's output root lies below it."""
    return f"{warehouse.rstrip('/')}/{TABLE}"


def output_root(warehouse: str, importer: int) -> str:
    """One importer's own output root. Two Spark jobs appending to one root corrupt it (SPARK-24238)."""
    return f"{table_path(warehouse)}/importer={importer}"
