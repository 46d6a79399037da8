"""The `messages` table as f8e2b8d and the builds before it wrote it: which of its Parquet files hold its
committed rows, and those rows in today's columns.

Only `logjam-sql --migrate` (tools/migrate.py) reads the old layout, through this module, and only
`_refuse_older_format` (table/delta.py) asks whether a directory is one; no other module knows it.

The old table was a directory tree at `<warehouse>/messages`: each importer wrote below its own root,
`importer=<I>/app_env=<escaped value>/date=<YYYY-MM-DD>/`, a Hive metastore (embedded Derby) named
each partition's location, and a commit protocol of its own (f8e2b8d's table/protocol.py, marker.py,
placement.py) decided which files a reader reads. In its terms, a partition's committed rows are:

- **fresh** (no `_compaction.json`): the data files of its directory;
- **compacted** (marker "done", generation g): the data files of `_compacted-<g>/`, and the files of
  the directory the marker does not retire: strays an importer placed since, which the old build
  moves in when it next follows the partition. A stray named like a file of `_compacted-<g>/` is
  that very file (a swap links what it did not merge), so it counts once;
- **swapping** (a compaction killed inside its swap): the rows of the marker's `previous` state, by
  the two rules above. The old build settles such a swap from its catalog (done if the catalog
  already names `_compacted-<g>/`, rolled back otherwise), which needs Spark and the metastore; this
  needs neither, because both choices hold the same rows. A swap first links into its new
  directory every file of the old location it did not merge, and a writer that meets a live swap
  puts a stray into both locations; meanwhile nothing of the old location is deleted (that waits
  for "done" and then the grace). The old location also holds the files as the importers wrote them,
  not a merge of them, so it is the one read here;
- **dropping** (`_dropping` present): none. Retention decided to drop the partition and died before
  the directory went; the old build would have finished the drop.

A data file is what Spark's readers read: a file whose name starts with neither `_` nor `.`.

Below `_staging/importer=<I>/`, a batch whose `<token>.moves` list is durable is committed: each of its
files still staged belongs to the partition its target names (the old build renames it there at its
next start), unless a later list `replaces` that token (its unplaced rest was quarantined into that
list's batch, whose files are the ones that count). A staged file no list names was never committed;
the device's journal replays its rows. Everything else in the tree holds no row of the table:
`_compacted-*` directories no marker names (a compaction's output never swapped in), retired files
waiting out their grace, `_dropped-*` (finished drops), `probe-*`, `.tmp` files of unfinished writes.

A marker that does not parse (torn by a power loss) was rebuilt by the old build from its catalog;
nothing on disk says which location is live then, so `partitions` refuses the table rather than guess,
naming the partition.
"""

from __future__ import annotations

import contextlib
import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from table.paths import dir_value
from table.schema import ARROW_SCHEMA, PARTITION_COLUMNS

IMPORTER_PREFIX = "importer="
STAGING = "_staging"
MARKER = "_compaction.json"
COMPACTED_PREFIX = "_compacted-"
DROPPING = "_dropping"
MOVES = ".moves"
# A directory named after a hash of its partition value (a name too long for the filesystem) keeps
# the value in this file, beside its `date=` dirs.
NAME_FILE = "_app_env"
# Hive's and Spark's escaping of a partition value in a directory name: `%XX`.
_HEX = set("0123456789abcdefABCDEF")

# Rows of one batch read from an old file: memory bounded however large the file. Migrating one
# partition of 2 million rows (delta-rs 1.6.6, rows of ~540 bytes decoded) peaked at 561-581 MB of RSS
# with batches of 64 Ki rows, ~425 with 16 Ki, 380-415 with 8 Ki at 12% more CPU; of 8 million rows,
# 564 with 64 Ki and 447 with 16 Ki: the peak is delta-rs's buffers and one batch, not the partition.
BATCH_ROWS = 16 * 1024


class OldTableError(RuntimeError):
    """The old table holds something this module cannot read without guessing (a torn marker or list)."""


@dataclass(frozen=True, slots=True)
class Partition:
    """One partition of the old table: importer `importer`'s rows of partition value `value` on `date`,
    in `files` (its committed files, in the order of their paths)."""

    importer: int
    value: str  # the old catalog's `app_env`: the stream's name, or a stand-in (`~overflow`, `~quarantine`, ...)
    date: str  # YYYY-MM-DD
    files: tuple[Path, ...]

    @property
    def app_env(self) -> str:
        """The partition value of these rows in the Delta table: today's importer names a partition
        after its directory (table/partitioning.py), so a name too long for one gets its hash there."""
        return dir_value(self.value)

    def rows(self) -> int:
        """Rows in its files, from their footers."""
        return sum(pq.read_metadata(p).num_rows for p in self.files)


def is_old_table(table_dir: Path) -> bool:
    """Whether `table_dir` holds a table of the old layout (an importer's root)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        return any(_importer(p) is not None for p in table_dir.iterdir())
    return False


def partitions(table_dir: Path) -> list[Partition]:
    """Every partition of the old table with committed rows, with their files; sorted by importer, then
    directory. Reads markers, lists and directory listings only, no data file."""
    out: list[Partition] = []
    for root in sorted(p for p in table_dir.iterdir() if _importer(p) is not None):
        importer = _importer(root)
        assert importer is not None
        staged = _listed(table_dir / STAGING / root.name)
        dirs = {(a.name, d.name) for a in root.glob("app_env=*") if a.is_dir()
                for d in a.glob("date=*") if d.is_dir()}
        for app_name, date_name in sorted(dirs | set(staged)):
            pdir = root / app_name / date_name
            files = _committed(pdir) if pdir.is_dir() else []
            present = {p.name for p in files}
            # A listed file counts once: staged (not renamed yet), or already in its partition.
            files += [f for f, target in staged.get((app_name, date_name), []) if target not in present]
            if files:
                out.append(Partition(importer, _value(root / app_name), _date(pdir), tuple(files)))
    return out


def rows(part: Partition, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The rows of a partition's files, a bounded batch at a time, in ARROW_SCHEMA's columns (or just
    `columns` of them), as the Delta table holds them (`doc` aside: it is made from `body` again).

    What the old files differ in: they lack the partition columns (they were the directories'); files
    of older builds lack columns added since (NULL here, as the old catalog read them); Spark wrote
    every column nullable, and the day's closing merge stored `doc` shredded, which is why `doc` is not
    read at all; a row of a hash-named partition keeps its stream's name in `original_app_env`."""
    schema = ARROW_SCHEMA if columns is None else pa.schema([ARROW_SCHEMA.field(c) for c in columns])
    for path in part.files:
        # INT96 (Spark's default timestamp before f8e2b8d's sessions asked for microseconds) as microseconds.
        with contextlib.closing(pq.ParquetFile(path, coerce_int96_timestamp_unit="us")) as parquet:
            present = set(parquet.schema_arrow.names)
            read = [c for c in schema.names if c in present and c not in PARTITION_COLUMNS]
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=read, use_threads=False):
                yield _conformed(batch, schema, part)


def _conformed(batch: pa.RecordBatch, schema: pa.Schema, part: Partition) -> pa.RecordBatch:
    n = batch.num_rows
    arrays = []
    for field in schema:
        if field.name == "app_env":
            arrays.append(pa.repeat(pa.scalar(part.app_env, pa.string()), n))
        elif field.name == "date":
            arrays.append(pa.repeat(pa.scalar(datetime.date.fromisoformat(part.date), pa.date32()), n))
        elif field.name == "original_app_env":
            own = batch.column("original_app_env") if "original_app_env" in batch.schema.names else pa.nulls(n, pa.string())
            # As today's importer fills it: the name, where the partition value is not the name.
            name = None if part.app_env == part.value else part.value
            arrays.append(pc.fill_null(own.cast(pa.string()), name) if name is not None else own.cast(pa.string()))
        elif field.name in batch.schema.names:
            # Naive timestamps (INT96) are UTC instants; `cast` keeps their values.
            arrays.append(batch.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- which files are committed -----------------------------------------------------------------------------------

def _committed(pdir: Path) -> list[Path]:
    """The committed files of one partition directory (the module's docstring has the rules)."""
    if (pdir / DROPPING).exists():
        return []
    marker = _marker(pdir)
    if marker is not None and marker["state"] == "swapping":
        marker = marker["previous"]  # the old location: whole until the swap is done
    if marker is None:
        return _data_files(pdir)
    location = pdir / f"{COMPACTED_PREFIX}{marker['gen']}"
    if not location.is_dir():
        raise OldTableError(f"{pdir / MARKER} names {location.name}, which is not there; the old build's "
                            f"catalog knows where this partition's rows are")
    held = _data_files(location)
    names = {p.name for p in held}
    return held + [p for p in _data_files(pdir) if p.name not in marker["retire"] and p.name not in names]


def _marker(pdir: Path) -> dict[str, Any] | None:
    """`_compaction.json` as {"gen", "state", "retire": names, "previous": the same or None}; None without one."""
    try:
        text = (pdir / MARKER).read_bytes()
    except FileNotFoundError:
        return None
    try:
        marker = _parsed(json.loads(text))
        if marker["state"] == "swapping" and marker["previous"] is not None:
            marker["previous"] = _parsed(marker["previous"])
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise OldTableError(f"{pdir / MARKER} does not parse ({e}): the old build rebuilds it from its catalog "
                            f"(f8e2b8d's logjam-sql --compact, or an importer's start); nothing on disk says "
                            f"which of its locations is live") from e
    return marker


def _parsed(raw: dict[str, Any]) -> dict[str, Any]:
    state = str(raw.get("state", "done"))
    if state not in ("done", "swapping"):
        raise ValueError(f"state {state!r}")
    retire = raw.get("retire") or {}  # {name: deadline}, or a list of names in the oldest markers
    return {"gen": int(raw["gen"]), "state": state, "retire": set(retire), "previous": raw.get("previous")}


def _listed(staging: Path) -> dict[tuple[str, str], list[tuple[Path, str]]]:
    """(app_env dir name, date dir name) -> [(staged file, its target's name)] of the durable lists below
    one importer's staging dir that no other list replaces."""
    lists: dict[str, tuple[list[tuple[str, str]], str | None]] = {}
    for listed in sorted(staging.glob(f"*{MOVES}")):
        try:
            raw = json.loads(listed.read_text())
            if isinstance(raw, list):  # lists written before `replaces`
                raw = {"moves": raw, "replaces": None}
            lists[listed.name[: -len(MOVES)]] = ([(str(a), str(b)) for a, b in raw["moves"]], raw.get("replaces"))
        except (ValueError, TypeError, KeyError) as e:
            raise OldTableError(f"{listed} does not parse ({e}): which staged files it names is unknown") from e
    replaced = {r for _, r in lists.values() if r is not None}
    out: dict[tuple[str, str], list[tuple[Path, str]]] = {}
    for token, (moves, _) in lists.items():
        if token in replaced:
            continue
        for staged, target in moves:
            # Where the file lies now, by its name: the list holds absolute paths of when it was written.
            here, aim = staging / Path(staged).name, Path(target)
            if here.is_file():
                out.setdefault((aim.parent.parent.name, aim.parent.name), []).append((here, aim.name))
    return out


def _data_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if not p.name.startswith(("_", ".")) and p.is_file())
    except FileNotFoundError:
        return []


def _importer(path: Path) -> int | None:
    if not path.name.startswith(IMPORTER_PREFIX) or not path.is_dir():
        return None
    try:
        return int(path.name[len(IMPORTER_PREFIX):])
    except ValueError:
        return None


def _value(app_dir: Path) -> str:
    """The partition value of an `app_env=` dir: what `_app_env` says for a hash-named one, else its unescaped name."""
    try:
        return (app_dir / NAME_FILE).read_bytes().decode("utf-8", "surrogateescape")
    except FileNotFoundError:
        return _unescape(app_dir.name[len("app_env="):])


def _date(pdir: Path) -> str:
    text = pdir.name[len("date="):]
    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError as e:
        raise OldTableError(f"{pdir}: {text!r} is not a date") from e


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "%" and len(text) >= i + 3 and set(text[i + 1 : i + 3]) <= _HEX:
            out.append(chr(int(text[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)
