"""An open day's merges written by pyarrow in this process, without a Spark job.

While a day is open, compaction merges each partition's files level by level
(warehouse/tiers.py): ten of an importer's 0.5-s files into one, ten of those into one, and so
on. Those files are the ones importers place (importer/place.py): the data columns and `doc`
as Parquet's unshredded Variant group, schema `table.schema.FILE_SCHEMA`. Merging them needs
no query engine: this reads their row groups and writes them again, zstd with the
dictionaries an importer uses, in row groups of ROW_GROUP_ROWS, each sorted by `created_at`
and with the bloom filters and page index of table/layout.py. Measured on e2e's rows: 3.3 us
of CPU a row, where Spark's rewrite took 12-13 us of the JVM a row (it shreds `doc`) plus a
job, and kept the JIT compiling while the mesh ran (docs/scaling.md, the fairness runs).

What is left to Spark: the day's closing merge (warehouse/compaction.py), which shreds `doc`
into typed columns so that the day stays fast to query for months, and any merge with a
file of another schema (written by Spark: an older version, `LOGJAM_NATIVE=off`, a merge of
a closed day), which this does not try to convert.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from runtime.durable import fsync_dir, fsync_file
from table.layout import LOOKUPS, Layout
from table.schema import FILE_SCHEMA
from warehouse.tiers import leveled_name

# Rows of one output row group: large enough that a query reads few of them per file, small
# enough that a merge holds one in memory (about 100 MB of e2e's rows decoded).
ROW_GROUP_ROWS = 128 * 1024


def mergeable(sources: Sequence[Path]) -> bool:
    """Whether every source holds exactly FILE_SCHEMA (so that the merge is a copy of rows)."""
    try:
        return all(pq.read_schema(p).equals(FILE_SCHEMA, check_metadata=False) for p in sources)
    except (OSError, pa.ArrowException):
        return False


def merge_files(sources: Sequence[Path], out: Path, level: int, files: int, layout: Layout = LOOKUPS) -> list[Path]:
    """Write the rows of `sources` into `files` new files of `level` in `out`, laid out by `layout`,
    fsynced; returns them."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for chunk in _chunks(sources, max(files, 1)):
        path = out / leveled_name(f"part-{uuid.uuid4().hex}-c000.zstd.parquet", level)
        _write(chunk, path, layout)
        fsync_file(path)
        written.append(path)
    fsync_dir(out)
    return written


def _chunks(sources: Sequence[Path], files: int) -> list[list[Path]]:
    """`sources` in order, cut into at most `files` runs of about equal bytes."""
    sizes = [p.stat().st_size for p in sources]
    share = sum(sizes) / files
    chunks: list[list[Path]] = [[]]
    taken = 0
    for path, size in zip(sources, sizes):
        # A file goes to the run its middle byte falls in.
        if chunks[-1] and taken + size / 2 > share * len(chunks) and len(chunks) < files:
            chunks.append([])
        chunks[-1].append(path)
        taken += size
    return chunks


def _write(chunk: Sequence[Path], path: Path, layout: Layout) -> None:
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(contextlib.closing(pq.ParquetFile(source))) for source in chunk]
        total = sum(f.metadata.num_rows for f in files)
        with pq.ParquetWriter(path, FILE_SCHEMA, **layout.arrow_merge_options(total, ROW_GROUP_ROWS)) as writer:
            pending: list[pa.Table] = []
            rows = 0
            for parquet in files:
                for group in range(parquet.num_row_groups):
                    table = parquet.read_row_group(group, use_threads=False)
                    pending.append(table)
                    rows += table.num_rows
                    if rows >= ROW_GROUP_ROWS:
                        _write_group(writer, pending, rows, layout)
                        pending, rows = [], 0
            if pending:
                _write_group(writer, pending, rows, layout)


def _write_group(writer: pq.ParquetWriter, tables: list[pa.Table], rows: int, layout: Layout) -> None:
    # Sorted by created_at, so that the page index narrows a time range to a few pages
    # (table/layout.py); the sources are already close to that order, and the sort costs
    # about 0.06 us a row against the merge's 3.3.
    writer.write_table(layout.sorted_rows(pa.concat_tables(tables)), row_group_size=rows)
