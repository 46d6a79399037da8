"""Where logjam-mesh keeps its table: the warehouse, the table's location, and its partition directories.

The default warehouse lies in the data root (logjam/defaults.py: `$LOGJAM_DATA_DIR`, else
`./data`); the table is the Delta table `<warehouse>/messages`. delta-rs names a partition's
directory `app_env=<value, escaped>/date=<YYYY-MM-DD>`, so a partition value is also a
directory name: a stream name too long for one gets a stand-in value (`dir_value`), and the
rows keep their name in `original_app_env` (table/partitioning.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from logjam.defaults import data_root
from table.schema import TABLE_NAME

# The characters escaped as %XX in a partition directory name: Hive's and Spark's set
# (ExternalCatalogUtils.escapePathName), and the space, which delta-rs escapes too.
_ESCAPED = set(range(0x01, 0x21)) | {ord(c) for c in "\"#%'*/:=?\\\x7f{[]^"}


def default_warehouse() -> str:
    return str(data_root() / "warehouse")


def normalise_warehouse(path: str) -> str:
    """Absolute local paths stay usable when handed to a Spark server started elsewhere; URLs pass through."""
    if "://" in path or path.startswith("file:"):
        return path.rstrip("/")
    return str(Path(path).expanduser().resolve())


def local_path(location: str) -> Path | None:
    """The local filesystem path of a Spark location (`/x`, `file:/x`, `file:///x`), or None for hdfs:// etc."""
    if location.startswith("file:"):
        return Path("/" + location[len("file:"):].lstrip("/"))
    if "://" in location:
        return None
    return Path(location)


def table_path(warehouse: str) -> str:
    """The table's location under a warehouse."""
    return f"{warehouse.rstrip('/')}/{TABLE_NAME}"


# A partition's directory name `app_env=<escaped value>` must fit NAME_MAX (255 bytes on every
# common filesystem); longer ones get a directory named after a hash of the value instead.
MAX_DIR_NAME = 200
# Stand-in partition values: no app-env the device accepts lacks a '-', and these have none,
# so a stand-in never collides with a real stream name.
STAND_IN = "~"
OVERFLOW = "~overflow"
QUARANTINE = "~quarantine"


def is_stand_in(value: str) -> bool:
    return value.startswith(STAND_IN) and "-" not in value


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def dir_value(value: str) -> str:
    """What the partition directory is named after (`app_env=<this>`): the value, or its hash when too long."""
    if len(f"app_env={escape_partition_value(value)}".encode()) <= MAX_DIR_NAME:
        return value
    return f"{STAND_IN}d{_digest(value)}"


def escape_partition_value(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if ord(c) in _ESCAPED else c for c in value)


def partition_dir(root: str, app_env: str, date: str) -> str:
    """`<root>/app_env=<escaped>/date=<date>`: where the rows of partition value `app_env` live."""
    return f"{root.rstrip('/')}/app_env={escape_partition_value(dir_value(app_env))}/date={date}"
