"""What each writer of the table's Parquet files asks of Parquet so that a lookup can skip them.

A search for one request id, trace id or event id across a month reads, without help, the
id's column of every file of every partition. Three things let a reader skip instead
(docs/schema.md, "Layout for lookups", has what each costs):
- **bloom filters** on LOOKUP_COLUMNS, one per column chunk, sized for the rows it holds:
  a reader tests the id against the filter and skips the row group when it is absent;
- **page indexes** (min and max of each page): with rows sorted by `created_at`, a
  time range reads only its pages;
- **rows sorted by `created_at`** in each row group an open day's merge writes, and in each
  file a Spark merge writes (a day's closing merge included).

The writers: an importer's placed file (importer/place.py), an open day's merge by pyarrow
(warehouse/arrow_merge.py) and a merge by Spark (warehouse/compaction.py). Each is handed a
`Layout` (`TableWriter`'s and `maintenance_pass`'s `layout`, LOOKUPS unless a caller says
otherwise) and takes its options for the rows it writes; the base options (compression,
dictionaries) stay in table/schema.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from table.schema import ARROW_MERGE_OPTIONS, ARROW_WRITE_OPTIONS, COMPACT_OPTIONS, FILE_SCHEMA

# The columns a lookup names one value of: high-cardinality ids, where min/max statistics
# skip nothing (random hex) and a bloom filter skips almost everything.
LOOKUP_COLUMNS: tuple[str, ...] = tuple(c for c in ("request_id", "trace_id", "event_id") if c in FILE_SCHEMA.names)
SORT_COLUMN = "created_at"
# 1% false positives: a needle query reads one row group in a hundred that lacks its id,
# for about 1.2 bytes a distinct value (measured with pyarrow: 41.1 → 45.6 bytes a row of
# random ids with three filters, 0.45 → 0.50 us of CPU a row).
BLOOM_FPP = 0.01
# A filter is sized for the distinct values it will hold. One is written per row group, so
# it never needs more than a row group's rows (pyarrow's ROW_GROUP_ROWS; Spark's row groups
# of 128 MB hold about a million of our rows), and sizing it for a day's rows would only
# waste bytes that every lookup reads.
MAX_BLOOM_NDV = 1_000_000


def _ndv(rows: int, row_group_rows: int | None = None) -> int:
    return max(1, min(rows, row_group_rows or MAX_BLOOM_NDV, MAX_BLOOM_NDV))


@dataclass(frozen=True, slots=True)
class Layout:
    """How a writer lays out the table's files. `for_lookups` False: the maintenance pass keeps no
    lookup index for the files it writes (a reference table without these aids subclasses this:
    benchmarks/month.py's `PlainLayout`)."""

    for_lookups: bool = True

    def sorted_rows(self, table: Any) -> Any:
        """An Arrow table's rows in `created_at` order (stable: rows of one time keep their order)."""
        return table.sort_by(SORT_COLUMN)

    def sorted_frame(self, df: Any, *first: str) -> Any:
        """A Spark DataFrame whose rows are sorted within each of its partitions by `first`, then `created_at`."""
        return df.sortWithinPartitions(*first, SORT_COLUMN)

    def placed_file_options(self, rows: int) -> dict[str, Any]:
        """pyarrow's options for an importer's placed file of `rows` rows (one row group)."""
        return {**ARROW_WRITE_OPTIONS, **self._arrow_lookups(rows, None)}

    def arrow_merge_options(self, rows: int, row_group_rows: int) -> dict[str, Any]:
        """pyarrow's options for an open day's merge of `rows` rows in row groups of `row_group_rows`."""
        return {**ARROW_MERGE_OPTIONS, **self._arrow_lookups(rows, row_group_rows)}

    def spark_merge_options(self, rows: int) -> dict[str, str]:
        """Spark's (parquet-mr's) options for a merge of at most `rows` rows a file. parquet-mr
        writes page indexes by default; bloom filters only for the columns named."""
        ndv = str(_ndv(rows))
        options = dict(COMPACT_OPTIONS)
        for c in LOOKUP_COLUMNS:
            options[f"parquet.bloom.filter.enabled#{c}"] = "true"
            options[f"parquet.bloom.filter.expected.ndv#{c}"] = ndv
            options[f"parquet.bloom.filter.fpp#{c}"] = str(BLOOM_FPP)
        return options

    def _arrow_lookups(self, rows: int, row_group_rows: int | None) -> dict[str, Any]:
        ndv = _ndv(rows, row_group_rows)
        return {"write_page_index": True,
                "bloom_filter_options": {c: {"ndv": ndv, "fpp": BLOOM_FPP} for c in LOOKUP_COLUMNS}}


# The layout every writer of the product uses.
LOOKUPS = Layout()
