"""An open day's merges without Spark (warehouse/arrow_merge.py), and which merges stay Spark's.

The pyarrow merge is checked on its own (rows kept in their sources' order where their times
are equal, each row group sorted by time with bloom filters and a page index, row groups, the
cut into several files, the schema check that sends other files to Spark), then through compaction's
own steps against the session's real Spark: files an importer placed are merged by pyarrow
and read back through the catalog with `doc` intact; files Spark wrote, and a closed day's
merge, are still written by Spark, in the same layout for lookups.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from importer.write import TableWriter
from table import protocol
from table.partition_files import data_files
from table.paths import local_path
from table.layout import LOOKUP_COLUMNS
from table.schema import FILE_SCHEMA, TIMESTAMP
from tests.test_compaction import Table
from warehouse import arrow_merge, compaction
from warehouse.tiers import TierPolicy, level_of

pytestmark = pytest.mark.timeout(300)


def rows(start: int, n: int) -> pa.Table:
    """`n` rows of FILE_SCHEMA, seq start..start+n-1, `doc` bytes that name the row."""
    cols = {}
    for f in FILE_SCHEMA:
        if f.name == "seq":
            cols[f.name] = pa.array(range(start, start + n), pa.int64())
        elif f.name == "doc":
            cols[f.name] = pa.array([{"value": b"v%d" % i, "metadata": b"m"} for i in range(start, start + n)],
                                    f.type)
        elif f.nullable:
            cols[f.name] = pa.nulls(n, f.type)
        elif pa.types.is_timestamp(f.type):
            cols[f.name] = pa.array([0] * n, pa.int64()).cast(f.type)
        elif pa.types.is_integer(f.type):
            cols[f.name] = pa.array([7] * n, f.type)
        else:
            cols[f.name] = pa.array(["x"] * n, f.type)
    return pa.table(cols, schema=FILE_SCHEMA)


def sources(tmp_path: Path, sizes: list[int]) -> list[Path]:
    out, start = [], 0
    for k, n in enumerate(sizes):
        path = tmp_path / f"part-{k}.snappy.parquet"
        pq.write_table(rows(start, n), path, compression="snappy")
        out.append(path)
        start += n
    return out


def test_a_merge_keeps_every_row_in_order_in_large_row_groups(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(arrow_merge, "ROW_GROUP_ROWS", 1000)
    srcs = sources(tmp_path, [300] * 9 + [50])
    assert arrow_merge.mergeable(srcs)
    [out] = arrow_merge.merge_files(srcs, tmp_path / "out", 2, 1)
    assert level_of(out.name) == 2 and out.name.endswith(".zstd.parquet")
    meta = pq.read_metadata(out)
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [1200, 1200, 350]
    assert meta.row_group(0).column(0).compression == "ZSTD"
    got = pq.read_table(out)
    assert got.schema.equals(FILE_SCHEMA, check_metadata=False)
    assert got.column("seq").to_pylist() == list(range(2750))
    assert got.column("doc").to_pylist()[2749] == {"value": b"v2749", "metadata": b"m"}


def lookup_layout(path: Path) -> tuple[set[str], bool, bool]:
    """A file's columns with a bloom filter in every row group, whether every column chunk has a page
    index, and whether each row group's rows are in `created_at` order."""
    meta = pq.read_metadata(path)
    chunks = [meta.row_group(g).column(c) for g in range(meta.num_row_groups) for c in range(meta.num_columns)]
    names = {c.path_in_schema for c in chunks}
    bloom = {n for n in names if all(c.bloom_filter_offset is not None for c in chunks if c.path_in_schema == n)}
    parquet = pq.ParquetFile(path)
    in_order = all(
        (ts := parquet.read_row_group(g, columns=["created_at"]).column(0).to_pylist()) == sorted(ts)
        for g in range(meta.num_row_groups))
    return bloom, all(c.has_column_index and c.has_offset_index for c in chunks), in_order


def test_a_merge_sorts_each_row_group_by_time_with_bloom_filters_on_the_ids(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(arrow_merge, "ROW_GROUP_ROWS", 500)
    srcs = []
    for k in range(4):  # each source in order, the four overlapping in time
        t = rows(k * 300, 300)
        t = t.set_column(t.schema.get_field_index("created_at"), FILE_SCHEMA.field("created_at"),
                         pa.array([(k * 100 + i) * 1_000_000 for i in range(300)], pa.int64()).cast(TIMESTAMP))
        t = t.set_column(t.schema.get_field_index("request_id"), FILE_SCHEMA.field("request_id"),
                         pa.array([f"{k:02d}{i:030x}" for i in range(300)]))
        path = tmp_path / f"part-{k}.snappy.parquet"
        pq.write_table(t, path)
        srcs.append(path)
    [out] = arrow_merge.merge_files(srcs, tmp_path / "out", 1, 1)
    bloom, page_index, in_order = lookup_layout(out)
    assert bloom == set(LOOKUP_COLUMNS) and {"request_id", "event_id"} <= bloom
    assert page_index and in_order
    got = pq.read_table(out)
    assert sorted(got.column("seq").to_pylist()) == list(range(1200))


def test_a_merge_into_several_files_cuts_by_bytes_and_loses_nothing(tmp_path) -> None:
    srcs = sources(tmp_path, [400] * 6)
    outs = arrow_merge.merge_files(srcs, tmp_path / "out", 1, 3)
    assert len(outs) == 3
    seqs = [s for p in outs for s in pq.read_table(p).column("seq").to_pylist()]
    assert sorted(seqs) == list(range(2400)) and all(pq.read_metadata(p).num_rows == 800 for p in outs)


def test_files_of_another_schema_are_not_merged_here(tmp_path) -> None:
    srcs = sources(tmp_path, [10, 10])
    other = tmp_path / "spark.parquet"
    pq.write_table(rows(0, 5).drop_columns(["doc"]), other)
    assert not arrow_merge.mergeable([*srcs, other])
    assert not arrow_merge.mergeable([*srcs, tmp_path / "gone.parquet"])


@pytest.mark.spark
def test_an_open_days_placed_files_merge_without_spark_and_the_rest_with_it(spark_server, tmp_path) -> None:
    """Placed files: pyarrow; files Spark wrote, and a closed day: Spark. All rows and `doc` read back."""
    t = Table(spark_server, tmp_path / "wh")
    today = datetime.datetime.now(datetime.timezone.utc).date()
    for _ in range(3):
        t.land(40, day=today)
    part = next(p for p in protocol.local_partitions(t.location) if p.app_env == "shop-prod")
    policy = TierPolicy(fanin=3)
    merge = compaction.plan(t.spark, t.database, part, policy, closed=False, grace=0)
    assert merge is not None and len(merge.sources) == 3
    assert compaction.write_merges(t.spark, [merge], local_path(t.location) / compaction.SCRATCH) == 0
    assert all(not isinstance(done, BaseException) for _, done in compaction.swap_all(t.spark, t.database, [merge],
                                                                                       grace=0))
    assert [level_of(p.name) for p in data_files(t.pdir(today) / merge.out.name)] == [1]
    assert t.count(day=today) == (120, 120)
    docs = t.spark.sql(f"SELECT count(*) FROM {t.database}.messages WHERE date = DATE'{today}' "
                       f"AND variant_get(doc, '$.message', 'string') = concat('m', seq)").collect()[0][0]
    assert docs == 120

    # Rows Spark wrote (an importer whose Spark does not share its filesystem) make the next open merge Spark's.
    t.writer = TableWriter(t.database, 0, t.location, staging=False)
    for _ in range(3):
        t.land(40, day=today)
    merge = compaction.plan(t.spark, t.database, part, policy, closed=False, grace=0)
    assert merge is not None and not arrow_merge.mergeable(merge.sources)
    assert compaction.write_merges(t.spark, [merge], local_path(t.location) / compaction.SCRATCH) == 1
    list(compaction.swap_all(t.spark, t.database, [merge], grace=0))
    # A closed day's merge is Spark's whatever wrote the files: it shreds `doc`.
    closing = compaction.plan(t.spark, t.database, part, policy, closed=True, grace=0)
    assert closing is not None and closing.closed
    assert compaction.write_merges(t.spark, [closing], local_path(t.location) / compaction.SCRATCH) == 1
    for path in data_files(closing.out):  # Spark's files: the same layout for lookups
        bloom, page_index, in_order = lookup_layout(path)
        assert bloom >= set(LOOKUP_COLUMNS) and page_index and in_order, path
    list(compaction.swap_all(t.spark, t.database, [closing], grace=0))
    assert t.count(day=today) == (240, 240)
