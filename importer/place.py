"""A batch written as the table's own Parquet files, placed into its partitions without a Spark job.

When the importer shares the table's filesystem with Spark, it writes one Parquet file per
partition of the batch (each partition's rows are together already, `grouped`, `doc` encoded by
importer/variant.py) into the staging directory of its own root, and the commit protocol's
placement (table/placement.py) renames each into its partition's directory: what Spark's file committer
did at job commit, without the job. The catalog's part (registering new partitions,
following a compaction's swap) stays with Spark.

`place` is idempotent per token: the files are staged and fsynced, then listed in
`<token>.moves` (fsynced), then renamed. A second call with the same token (a retry after an
error) finishes the list: it renames the files still staged and no others, so a file is
placed exactly once whatever failed. A process killed after the list was written has its
renames finished at the next start (`protocol.recover_placements`); one killed before leaves
staged files that never committed, which that start removes (replay brings their rows back).
The files and the directories they went to are fsynced before `place` returns, so a batch is
durable before the importer's checkpoint (fsynced too) moves past it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from runtime.durable import fsync_file
from table.paths import partition_dir
from table.layout import LOOKUPS, Layout
from table.placement import MOVES, begin_placement, finish_placement, listed_targets
from table.schema import PARTITION_COLUMNS


def partition_keys(table: pa.Table) -> np.ndarray:
    """Each row's partition as one int64: its app_env's number (in order of first appearance) above its
    date's day number. Rows of one partition have one key; rows of two, two keys."""
    apps = table.column("app_env").combine_chunks().dictionary_encode().indices.to_numpy(zero_copy_only=False)
    days = table.column("date").combine_chunks().cast(pa.int32()).to_numpy(zero_copy_only=False)
    return (apps.astype(np.int64) << 32) | (days.astype(np.int64) & 0xFFFFFFFF)


def grouped(table: pa.Table) -> pa.Table:
    """`table` with each partition's rows together, in the order they came (a stable sort by
    `partition_keys`). A batch whose rows already are (one stream at a time, the usual case) is
    returned as it is, uncopied: the sort's copy of every column cost about 0.25 us an event, of the
    4.5 that benchmarks/importer_decode.py --place --streams 1 measures."""
    if table.num_rows < 2:
        return table
    keys = partition_keys(table)
    if (keys[1:] >= keys[:-1]).all():
        return table
    return table.take(pa.array(np.argsort(keys, kind="stable")))


def runs(table: pa.Table) -> list[tuple[int, int]]:
    """(start, stop) of each partition's rows in a table whose partitions' rows are together (`grouped`)."""
    rows = table.num_rows
    if rows == 0:
        return []
    keys = partition_keys(table)
    change = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    edges = [0, *change.tolist(), rows]
    return list(zip(edges[:-1], edges[1:]))


def stage(table: pa.Table, staging: Path, root: Path, token: str, layout: Layout = LOOKUPS) -> list[tuple[str, str]]:
    """Write and fsync one staged file per partition, laid out by `layout`; returns (staged, target) pairs.
    Nothing is placed yet."""
    staging.mkdir(parents=True, exist_ok=True)
    data = table.drop_columns(list(PARTITION_COLUMNS))
    moves: list[tuple[str, str]] = []
    try:
        for n, (start, stop) in enumerate(runs(table)):
            value = table.column("app_env")[start].as_py()
            day = table.column("date")[start].as_py().isoformat()
            staged = staging / f"{token}-{n}.parquet"
            pq.write_table(data.slice(start, stop - start), staged, **layout.placed_file_options(stop - start))
            fsync_file(staged)
            target = Path(partition_dir(str(root), value, day)) / f"part-{token}-{n}.snappy.parquet"
            moves.append((str(staged), str(target)))
    except BaseException:
        unstage(staging, token)
        raise
    return moves


def unstage(staging: Path, token: str) -> None:
    """Remove a token's staged files that were never listed (a failed staging)."""
    for path in staging.glob(f"{token}-*.parquet"):
        path.unlink(missing_ok=True)


def place(table: pa.Table, staging: Path, root: Path, token: str,
          ensure_dirs: Callable[[list[Path]], None] = lambda dirs: None, replaces: str | None = None,
          layout: Layout = LOOKUPS) -> int:
    """Place `table` (`grouped`, `app_env` holding directory values, `doc` encoded) into its partitions under
    `root` as the batch `token`; returns the files renamed by this call. Call with the root's lock held.

    `ensure_dirs(dirs)` is given the partition dirs that are missing or being dropped, to register
    them before anything is renamed into them. `replaces`: the token of a listed batch whose unplaced
    rest `table` is (quarantine); it is abandoned once this batch is listed. `layout`: how its files
    are written (table/layout.py)."""
    listed = staging / f"{token}{MOVES}"
    if not listed.exists():
        begin_placement(staging, token, stage(table, staging, root, token, layout), replaces)
    waiting = [Path(t).parent for s, t in listed_targets(listed) if Path(s).exists()]
    ensure_dirs(sorted(set(waiting)))
    return finish_placement(listed)


def unplaced(staging: Path, token: str) -> set[Path] | None:
    """The partition dirs a listed batch has not reached yet; None when nothing of `token` is listed."""
    listed = staging / f"{token}{MOVES}"
    if not listed.exists():
        return None
    return {Path(t).parent for s, t in listed_targets(listed) if Path(s).exists()}
