"""Rows waiting for their partitions: kept durably on the importer's disk while a burst of new streams is registered.

Registering a partition costs the metastore 2-3 ms (measured), and writing into a new
partition directory about as much again, so a burst of 10,000 new streams would hold one
commit, and every stream that already flows with it, for most of a minute. Instead a
job takes the rows of partitions that exist plus as many new ones as fit in its time budget
(importer/plan.py, NewPartitionBudget);
the rest are written here first (fsynced, before that job commits, so the table never holds
rows that were received after rows it lacks and that are nowhere durable), and each later
job takes the next share of them. After a restart the files are read back, less the rows the
table already holds (a job that committed before its spill file was rewritten).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from runtime.durable import fsync_dir, replace_file
from table.catalog import seqs_in_table
from table.schema import conform

log = logging.getLogger(__name__)


class Spill:
    """The spill files of one importer, oldest first."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self.files: list[Path] = sorted(self.dir.glob("*.parquet"))
        for stale in self.dir.glob("*.parquet.tmp"):
            stale.unlink()

    @property
    def rows(self) -> int:
        return sum(pq.read_metadata(p).num_rows for p in self.files)

    def put(self, table: pa.Table) -> Path:
        """Keep `table` durably; returns its file."""
        path = self.dir / f"{time.time_ns():020d}.parquet"  # names sort in the order the rows arrived
        self._write(path, table)
        self.files.append(path)
        return path

    def head(self) -> tuple[Path, pa.Table] | None:
        return (self.files[0], conform(pq.read_table(self.files[0]))) if self.files else None

    def done(self, path: Path, rest: pa.Table | None) -> None:
        """`path`'s rows are in the table but for `rest` (None: all of them)."""
        if rest is None or rest.num_rows == 0:
            path.unlink()
            fsync_dir(self.dir)
            self.files.remove(path)
        else:
            self._write(path, rest)

    def prune(self, spark: Any, database: str, importer: int) -> None:
        """After a restart: drop the rows the table already holds."""
        for path in list(self.files):
            table = conform(pq.read_table(path))
            landed = _landed(spark, database, importer, table)
            if landed:
                keep = pa.array([(d, s) not in landed for d, s in zip(table.column("device").to_pylist(),
                                                                      table.column("seq").to_pylist())])
                self.done(path, table.filter(keep))
        if self.files:
            log.info("%d rows from before the restart wait in %s for their partitions", self.rows, self.dir)

    def _write(self, path: Path, table: pa.Table) -> None:
        out = pa.BufferOutputStream()
        pq.write_table(table, out, compression="lz4")
        replace_file(path, out.getvalue().to_pybytes())


def _landed(spark: Any, database: str, importer: int, table: pa.Table) -> set[tuple[int, int]]:
    found: set[tuple[int, int]] = set()
    for device in pc.unique(table.column("device")).to_pylist():
        seqs = table.filter(pc.equal(table.column("device"), device)).column("seq")
        low, high = pc.min(seqs).as_py(), pc.max(seqs).as_py()
        found |= {(device, s) for s in seqs_in_table(spark, database, importer, device, low, high)}
    return found
