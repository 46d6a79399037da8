"""A batch written as the table's own Parquet files, placed into its partitions without a Spark job.

When the importer shares the table's filesystem with Spark and encodes `doc` itself (in C),
the Parquet file it stages already holds every row exactly as Spark's write would store it:
the data columns, `doc` as the two-binary group Spark reads as a VARIANT. Spark's job then
only read that file, sorted it by partition and wrote it again, and that was most of Spark's
CPU per event (docs/importer.md, the profile). So the importer writes one file per partition
of the batch (the rows are sorted by app_env and date already), in the staging directory
of its own root, and renames each into its partition's directory: what Spark's file
committer did at job commit, without the job. The catalog's part (registering new
partitions, following a compaction's swap) stays with Spark, as before.

A batch is in the table whole or not at all. A batch of one partition is one rename. For
more, the list of renames is written first (`<token>.moves`, replaced atomically); a process
killed between the renames leaves the list, and `recover` finishes it at the next start,
before anything reads the table's max(seq). Without the list, staged files are leftovers of
a batch that never committed, and are removed (replay brings their rows back). The files and
the directories they went to are fsynced before `place` returns, so a batch is durable
before the importer's checkpoint (fsynced too) moves past it: after a power loss the
checkpoint never points past rows the table lost (Spark's file committer fsyncs nothing).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from runtime.durable import fsync_dir, fsync_file, replace_file
from table.paths import partition_dir
from table.schema import ARROW_WRITE_OPTIONS, PARTITION_COLUMNS

MOVES = ".moves"


def runs(table: pa.Table) -> list[tuple[int, int]]:
    """(start, stop) of each partition's rows in a table sorted by (app_env, date)."""
    rows = table.num_rows
    if rows == 0:
        return []
    apps = table.column("app_env").combine_chunks().dictionary_encode().indices.to_numpy(zero_copy_only=False)
    days = table.column("date").combine_chunks().cast(pa.int32()).to_numpy(zero_copy_only=False)
    change = np.flatnonzero((apps[1:] != apps[:-1]) | (days[1:] != days[:-1])) + 1
    edges = [0, *change.tolist(), rows]
    return list(zip(edges[:-1], edges[1:]))


def place(table: pa.Table, staging: Path, root: Path) -> int:
    """Write `table` (sorted, `app_env` holding directory values, `doc` encoded) into its partitions
    under `root`; returns the files placed. Call with the root's lock held."""
    staging.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    data = table.drop_columns(list(PARTITION_COLUMNS))
    moves: list[tuple[str, str]] = []
    for n, (start, stop) in enumerate(runs(table)):
        value = table.column("app_env")[start].as_py()
        day = table.column("date")[start].as_py().isoformat()
        staged = staging / f"{token}-{n}.parquet"
        pq.write_table(data.slice(start, stop - start), staged, **ARROW_WRITE_OPTIONS)
        fsync_file(staged)
        target = Path(partition_dir(str(root), value, day)) / f"part-{token}-{n}.snappy.parquet"
        moves.append((str(staged), str(target)))
    listed = staging / f"{token}{MOVES}"
    if len(moves) > 1:
        replace_file(listed, json.dumps(moves))
    _move(moves)
    for directory in sorted({os.path.dirname(target) for _, target in moves}):
        fsync_dir(directory)
    listed.unlink(missing_ok=True)
    return len(moves)


def _move(moves: list[tuple[str, str]]) -> None:
    for staged, target in moves:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(staged, target)


def recover(staging: Path) -> int:
    """At start: finish the renames of batches a killed process left listed, then remove what is
    left staged (batches that never committed; replay brings their rows back). Returns the
    batches finished."""
    finished = 0
    for listed in sorted(staging.glob(f"*{MOVES}")):
        moves = [(str(a), str(b)) for a, b in json.loads(listed.read_text())]
        _move([(a, b) for a, b in moves if os.path.exists(a)])
        listed.unlink()
        finished += 1
    for stale in [*staging.glob("*.parquet"), *staging.glob("*.tmp")]:
        stale.unlink(missing_ok=True)
    return finished
