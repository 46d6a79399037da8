"""Where logjam-mesh keeps its table: the warehouse, and the `messages` table's directories.

The default warehouse lies in the data root (logjam/defaults.py: `$LOGJAM_DATA_DIR`, else
`./data`).

Inside the table's location every importer writes only below its own root,
`importer=<I>/app_env=<app-env>/date=<YYYY-MM-DD>/`, and under that root's lock
(table/protocol.py): one writer per root at a time (two Spark jobs appending under one output
path would also share its `_temporary` directory and corrupt each other, SPARK-24238).
Batches being placed wait in `_staging/importer=<I>/`, which Spark's readers skip like every
name starting with `_`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from logjam.defaults import data_root
from table.schema import TABLE_NAME

# The characters Hive and Spark escape as %XX in a partition directory name
# (ExternalCatalogUtils.escapePathName), so that a value maps to exactly one directory.
_ESCAPED = set(range(0x01, 0x20)) | {ord(c) for c in "\"#%'*/:=?\\\x7f{[]^"}


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
    """The table's default location under a warehouse: every importer's output root lies below it."""
    return f"{warehouse.rstrip('/')}/{TABLE_NAME}"


def output_root(table_location: str, importer: int) -> str:
    """One importer's own output root inside the table's location."""
    return f"{table_location.rstrip('/')}/importer={importer}"


def staging_dir(table_location: str, importer: int) -> str:
    """Where an importer stages the Parquet files of a batch before they are renamed into place."""
    return f"{table_location.rstrip('/')}/_staging/importer={importer}"


# A partition's directory name `app_env=<escaped value>` must fit NAME_MAX (255 bytes on every
# common filesystem); longer ones get a directory named after a hash of the value instead.
MAX_DIR_NAME = 200
# The Hive metastore keeps a partition's name (`importer=I/app_env=<escaped>/date=D`) in a
# VARCHAR(767): a value whose escaped name does not fit cannot be a partition value at all.
MAX_PARTITION_NAME = 767
# Stand-in partition values: no app-env the device accepts lacks a '-', and these have none,
# so a stand-in never collides with a real stream name.
STAND_IN = "~"
OVERFLOW = "~overflow"
QUARANTINE = "~quarantine"
# The exact partition value of a hash-named directory, for anything that reads the tree.
NAME_FILE = "_app_env"


def is_stand_in(value: str) -> bool:
    return value.startswith(STAND_IN) and "-" not in value


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:32]


def partition_value(importer: int, app_env: str) -> str:
    """The catalog's `app_env` for a stream: its name, or a stand-in when the metastore cannot hold the name."""
    name = f"importer={importer}/app_env={escape_partition_value(app_env)}/date=YYYY-MM-DD"
    if len(name) <= MAX_PARTITION_NAME or is_stand_in(app_env):
        return app_env
    return f"{STAND_IN}{_digest(app_env)}"


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


def unescape_partition_value(text: str) -> str:
    """The value a partition directory name stands for (the inverse of escape_partition_value)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "%" and _is_hex(text[i + 1 : i + 3]):
            out.append(chr(int(text[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _is_hex(pair: str) -> bool:
    return len(pair) == 2 and all(c in "0123456789abcdefABCDEF" for c in pair)
