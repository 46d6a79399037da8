"""The `messages` table as a Delta table: its Delta schema, creating and opening it, and how a batch commits.

Only delta-rs writes the table. Importers append (one commit per batch, `append` here) and
logjam-spark's maintenance compacts, checkpoints, deletes old days and vacuums
(warehouse/maintenance.py); Spark and every other engine read it through its log.
docs/reliability.md, "How the mesh uses Delta's log", states what each writer commits and why
no row is lost or landed twice.

Exactly once: every commit of an importer carries one app transaction (`txn`) per device
journal its batch covers, whose version is the highest seq of that journal the batch covers.
Rows whose journal is not known (device 0, a device that announces no journal, an importer
under --no-replay) carry none: their seqs say nothing across a device's restart.
`append` reads those versions from the snapshot it commits on, drops the rows at or below
them, and commits the rest with the new versions. Two writers of one journal (an importer and
the zombie it replaced) cannot both commit on one snapshot: the log's conflict check refuses
the second commit with the same appId (`CommitFailedError`), and its retry reads the versions
again. delta-rs itself accepts a txn whose version does not rise, which is why the writer
checks.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import (BloomFilterProperties, ColumnProperties, CommitProperties, DeltaTable, Field,
                       PostCommitHookProperties, Schema, TableFeatures, Transaction, VariantType, WriterProperties,
                       write_deltalake)
from deltalake.exceptions import CommitFailedError

from table.schema import ARROW_SCHEMA, DICTIONARY_COLUMNS, DOC_ARROW_TYPE, DOC_COLUMN, PARTITION_COLUMNS

log = logging.getLogger(__name__)

# The columns with min/max statistics in the log. Data skipping needs them only on the columns a
# query narrows by; statistics on every column made a commit of 40 partitions write 55 KB of log
# JSON instead of 26 (measured with delta-rs 1.6.6), and every reader parses that log.
STATS_COLUMNS = ("created_at", "ingested_at", "device", "seq", "level", "request_id", "trace_id", "span_id",
                 "event_id")
TABLE_CONFIGURATION = {"delta.dataSkippingStatsColumns": ",".join(STATS_COLUMNS)}

# The columns a lookup names one value of: random ids, where min/max skip nothing and a Parquet
# bloom filter skips almost every row group.
LOOKUP_COLUMNS = ("request_id", "trace_id", "event_id")
BLOOM_FPP = 0.01

# The table features this writer knows how to keep true. Any other (row tracking, liquid
# clustering, identity columns, type widening, in-commit timestamps, variant shredding, deletion
# vectors, column mapping, ...) asks of every writer something delta-rs does not do.
WRITABLE_FEATURES = frozenset({"appendOnly", "invariants", "checkConstraints", "changeDataFeed",
                               "generatedColumns", "timestampNtz", "variantType", "variantType-preview"})
# What the legacy writer versions (before table features) imply beyond version 4.
_LEGACY_WRITER_FEATURES = {5: ("columnMapping",), 6: ("columnMapping", "identityColumns")}

# Checkpoints and log cleanup are the maintenance actor's (warehouse/maintenance.py): at two
# commits a second an importer would otherwise write a checkpoint every 50 s inside a commit.
NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)

# A snapshot kept open grows what each commit walks: over 1,000 commits its CPU went from 12 to
# 149 ms; reopened every 100 commits it stayed at 14-28 ms (measured with delta-rs 1.6.6).
REOPEN_EVERY = 100
# Commits refused by the conflict check (another writer of the same journal) before giving up.
CONFLICT_RETRIES = 10


class UnwritableTable(RuntimeError):
    """The table uses a table feature this writer cannot keep, or is not a Delta table."""


def delta_schema() -> Schema:
    """The table's Delta schema: the Arrow columns in their order, then `doc` as a VARIANT."""
    fields = list(Schema.from_arrow(ARROW_SCHEMA).fields)
    return Schema([*fields, Field(DOC_COLUMN, VariantType(), nullable=True)])


def writer_properties(rows_per_file: int = 100_000, compression: str = "SNAPPY") -> WriterProperties:
    """Parquet as the table's writers lay it out: dictionaries only where values repeat, a bloom filter
    per row group on each lookup column sized for `rows_per_file` distinct values."""
    bloom = BloomFilterProperties(True, BLOOM_FPP, max(1, rows_per_file))
    columns = {c: ColumnProperties(dictionary_enabled=True) for c in DICTIONARY_COLUMNS}
    columns.update({c: ColumnProperties(dictionary_enabled=False, bloom_filter_properties=bloom)
                    for c in LOOKUP_COLUMNS})
    return WriterProperties(compression=compression,  # type: ignore[arg-type]
                            default_column_properties=ColumnProperties(dictionary_enabled=False),
                            column_properties=columns)


def open_table(location: str, storage_options: Mapping[str, str] | None = None, *,
               create: bool = True) -> DeltaTable:
    """The Delta table at `location`, created (empty, partitioned by app_env and date) when there is none;
    `UnwritableTable` when it uses a feature this writer cannot keep."""
    options = dict(storage_options or {})
    if not DeltaTable.is_deltatable(location, options):
        if not create:
            raise UnwritableTable(f"{location} is not a Delta table (no _delta_log)")
        _refuse_older_format(location)
        try:
            DeltaTable.create(location, delta_schema(), mode="ignore", partition_by=list(PARTITION_COLUMNS),
                              configuration=TABLE_CONFIGURATION, storage_options=options,
                              post_commithook_properties=NO_HOOKS)
            log.info("created the Delta table %s", location)
        except Exception:  # another process created it first: the put-if-absent of version 0 failed
            if not DeltaTable.is_deltatable(location, options):
                raise
    table = DeltaTable(location, storage_options=options)
    check_writable(table)
    return _readable_by_spark(table)


def _readable_by_spark(table: DeltaTable) -> DeltaTable:
    """The table with the `invariants` writer feature listed in its protocol (one commit, once).

    Delta for Spark counts every NOT NULL column as an invariant and refuses a table whose protocol
    does not list that feature (DELTA_FEATURES_PROTOCOL_METADATA_MISMATCH, even to name it in the
    catalog); delta-rs 1.6.6 creates the table without it, and cannot be asked to at create."""
    protocol = table.protocol()
    if protocol.min_writer_version < 7 or "invariants" in (protocol.writer_features or ()):
        return table
    if all(f.nullable for f in table.schema().fields):
        return table
    try:
        table.alter.add_feature(TableFeatures.Invariants, post_commithook_properties=NO_HOOKS)
    except CommitFailedError:  # another process added it first
        pass
    table.update_incremental()
    return table


def _refuse_older_format(location: str) -> None:
    """Refuse to create the Delta table over a table of the old layout: its rows would be hidden, and
    VACUUM would delete its files (they are in no commit). `logjam-sql --migrate` moves it in."""
    from table.old_layout import is_old_table
    from table.paths import local_path

    local = local_path(location)
    if local is not None and is_old_table(local):
        warehouse = str(local.parent)
        raise UnwritableTable(f"{location} holds a table of logjam-mesh's earlier Parquet format (importer=* "
                              f"directories, no _delta_log): stop the mesh and run `logjam-sql --migrate "
                              f"--warehouse {warehouse}` to move its rows into the Delta table there "
                              f"(docs/operations.md, \"Moving a table of the old layout\")")


def check_writable(table: DeltaTable) -> None:
    """Refuse, naming them, the table features this writer cannot keep (a Spark user may have turned them on)."""
    protocol = table.protocol()
    found = set(protocol.writer_features or ()) | set(_LEGACY_WRITER_FEATURES.get(protocol.min_writer_version, ()))
    refused = sorted(found - WRITABLE_FEATURES)
    if protocol.min_writer_version > 7:
        refused.append(f"writer version {protocol.min_writer_version}")
    if refused:
        raise UnwritableTable(f"the Delta table {table.table_uri} uses {', '.join(refused)}, which delta-rs cannot "
                              f"write; logjam-mesh's writers refuse it rather than break it (docs/schema.md)")


def app_id(journal: str, scope: int | None = None) -> str:
    """The appId of one device journal's progress, named after the journal's own id (which devices
    announce, unique per journal: a wiped or replaced journal gets a new one).

    `scope`: the importer, for a worker that lands only some streams of a device (its txn says how
    far its own share is, not the device's)."""
    return f"logjam:{journal}" if scope is None else f"logjam:{journal}:importer-{scope}"


def with_doc(rows: pa.Table, doc: pa.Array) -> pa.Table:
    """The rows as the table holds them: the Arrow columns, then `doc` (the encoder's Variant struct)."""
    return rows.append_column(pa.field(DOC_COLUMN, DOC_ARROW_TYPE), doc)


class Writer:
    """One writer's handle on the table: a snapshot it reopens every `REOPEN_EVERY` commits, and `append`."""

    def __init__(self, location: str, storage_options: Mapping[str, str] | None = None,
                 properties: WriterProperties | None = None) -> None:
        self.location = location
        self.storage_options = dict(storage_options or {})
        self.properties = properties or writer_properties()
        self.table = open_table(location, self.storage_options)
        self._commits = 0
        self.conflicts = 0  # commits refused because another writer landed the same journal first

    def refresh(self) -> DeltaTable:
        """The snapshot brought up to the latest version (reopened now and then, which keeps commits cheap)."""
        if self._commits >= REOPEN_EVERY:
            self.table = DeltaTable(self.location, storage_options=self.storage_options)
            check_writable(self.table)
            self._commits = 0
        else:
            self.table.update_incremental()
        return self.table

    def landed(self, app_ids: list[str]) -> dict[str, int]:
        """appId -> the version the table holds for it (absent: none), on the current snapshot."""
        out: dict[str, int] = {}
        for a in app_ids:
            v = self.table.transaction_version(a)
            if v is not None:
                out[a] = int(v)
        return out

    def append(self, rows: pa.Table, ids: pa.Array, txns: Mapping[str, int]) -> int:
        """Commit `rows` (the table's columns, `doc` last) with one txn per entry of `txns` (appId ->
        the highest seq this batch covers). `ids[i]`: row i's appId, or null for an untracked row.

        Rows at or below what the table already holds for their appId are dropped first, and a txn
        that would not rise is left out; returns the rows committed (0: everything had landed)."""
        for attempt in range(CONFLICT_RETRIES):
            table = self.refresh()
            landed = self.landed(list(txns))
            keep = _not_landed(rows, ids, landed)
            rising = [Transaction(a, v) for a, v in txns.items() if v > landed.get(a, -1)]
            if keep.num_rows == 0 and not rising:
                return 0
            try:
                started = time.monotonic()
                if keep.num_rows:
                    write_deltalake(table, keep, mode="append", writer_properties=self.properties,
                                    commit_properties=CommitProperties(app_transactions=rising),
                                    post_commithook_properties=NO_HOOKS)
                else:
                    # Only progress to record (everything covered was filtered or had landed): a
                    # commit with no files is not worth a log entry; the next batch records it.
                    return 0
                log.debug("committed %d rows in %.3fs", keep.num_rows, time.monotonic() - started)
                self._commits += 1
                return keep.num_rows
            except CommitFailedError as e:
                self.conflicts += 1
                log.warning("a commit lost to another writer of the same journal (%s); reading the table again", e)
                self._commits = REOPEN_EVERY  # reopen: the snapshot must include the winner
        raise CommitFailedError(f"{CONFLICT_RETRIES} commits in a row lost to other writers of the same journals")


def _not_landed(rows: pa.Table, ids: pa.Array, landed: Mapping[str, int]) -> pa.Table:
    if not landed or rows.num_rows == 0:
        return rows
    encoded = pc.dictionary_encode(ids)
    floors = pa.array([landed.get(a, -1) for a in encoded.dictionary.to_pylist()], pa.int64())
    floor = pc.fill_null(pc.take(floors, encoded.indices), -1)
    return rows.filter(pc.greater(rows.column("seq"), floor))


def recent_event_ids(table: DeltaTable, limit: int, days: int = 2) -> list[tuple[str, str]]:
    """(app_env, event_id) of the newest `limit` rows that have an event id, oldest first, from the
    table's newest `days` dates (what an importer's dedupe memory starts with)."""
    dates = sorted({p["date"] for p in table.partitions()})[-days:]
    if not dates or limit <= 0:
        return []
    first = datetime.date.fromisoformat(dates[0])
    rows = table.to_pyarrow_dataset().to_table(
        columns=["app_env", "original_app_env", "event_id", "ingested_at"],
        filter=(ds.field("date") >= first) & ds.field("event_id").is_valid())
    if rows.num_rows > limit:
        rows = rows.sort_by([("ingested_at", "descending")]).slice(0, limit)
    rows = rows.sort_by("ingested_at")
    names = pc.coalesce(rows.column("original_app_env"), rows.column("app_env")).to_pylist()
    return list(zip(names, rows.column("event_id").to_pylist()))
