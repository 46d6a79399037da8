"""One Spark job that appends a batch to the table, as an idempotent `Commit`.

`TableTarget` is where an importer's rows go and how one job gets them there:
1. The rows are sorted by (app_env, date).
2. The partitions it needs are registered in the catalog (table/catalog.py).
3. Under the root's lock, the rows become files of the table under this importer's own root.
   When the Spark server reads the same filesystem (checked at start with a probe file) and
   the importer encodes `doc` (importer/variant.py, in C), the importer writes them itself,
   one Parquet file per partition, and renames them into place (importer/place.py): no Spark
   job. Otherwise Spark writes them: from a staged Parquet file (parsing `doc` as it writes),
   or, with no shared filesystem, from rows sent inside the Spark Connect request, which is
   slower and holds the whole batch in the server's heap. Either way a batch is in the table
   whole or not at all.
4. Still under the lock, files that landed in a partition compaction is swapping are moved
   into its new location (table/compaction_protocol.py).

`Commit` is one such job with everything that belongs to it: its rows, the share of the
spill it carries (importer/spill.py), the check whether it already landed, and the move into
a compacted partition. `run(spark)` may be called again after any failure and leaves the
table as if it ran once: an attempt after the first first asks the table for the job's last
row, so a job that committed although its client saw an error is not written twice, and the
spill's share is marked done either way (Kafka Connect's sink task is the model: the
framework retries, the write is idempotent).
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from importer.failures import describe
from importer.place import place, recover
from importer.spill import Spill
from importer.variant import DocEncoder
from table.catalog import Partitions, seqs_in_table
from table.compaction_protocol import PartitionRef, settle_locked
from table.partition_files import MARKER, root_lock
from table.partitioning import PartitionMap, partitions_of
from table.paths import QUARANTINE, local_path, output_root, partition_dir, staging_dir
from table.schema import DOC_COLUMN, PARTITION_COLUMNS, WRITE_OPTIONS, with_doc

log = logging.getLogger(__name__)

_SORT = [("app_env", "ascending"), ("date", "ascending")]
# Row groups per staged file: Spark splits a file only between row groups.
_STAGED_ROW_GROUPS = 16
# An importer writes `doc` unshredded: shredding it at ingest halved the rows/s of Spark's write
# (measured, docs/schema.md); compaction's rewrite shreds it (its session keeps Spark's default).
_NO_SHREDDING = {"spark.sql.variant.writeShredding.enabled": "false"}

SpillShare = tuple[Path, "pa.Table | None"]  # a spill file and what stays in it once the job committed


class TableTarget:
    """One importer's part of the table: its root, its partitions, and the Spark job that appends rows."""

    def __init__(self, database: str, importer: int, location: str, *, staging: bool = True,
                 partition_map: PartitionMap | None = None,
                 on_lock_wait: Callable[[float], None] = lambda seconds: None) -> None:
        self.database = database
        self.importer = importer
        self.on_lock_wait = on_lock_wait
        self.root = output_root(location, importer)
        self.root_dir = local_path(self.root)
        self.partitions = Partitions(database, importer, self.root)
        self.map = partition_map or PartitionMap(importer)
        self.staging_dir = local_path(staging_dir(location, importer))
        self.staging: Path | None = self.staging_dir if staging else None
        self._configured: Any = None  # the session _NO_SHREDDING was set in
        self.doc_encoder = DocEncoder.load() if self.staging is not None else None

    def probe_staging(self, spark: Any) -> bool:
        """Keep staging only if Spark reads back a file staged here (same filesystem on both sides).

        First a batch a killed run left half placed is finished (importer/place.py), so that
        the table's max(seq) read after this counts it whole."""
        if self.staging_dir is not None and self.staging_dir.is_dir():
            finished = recover(self.staging_dir)
            if finished:
                log.info("finished placing %d batches a killed run had left half placed", finished)
        if self.staging is None:
            return False
        token = uuid.uuid4().hex
        path = self.staging / f"probe-{token}.parquet"
        try:
            self.staging.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"token": [token]}), path)
            rows = spark.read.parquet(f"file://{path}").collect()
            ok = len(rows) == 1 and rows[0][0] == token
        except Exception as e:  # an unreachable path fails in many ways on the server
            log.info("staging batches in %s is not possible (%s); sending them inside the Spark request",
                     self.staging, describe(e))
            ok = False
        finally:
            path.unlink(missing_ok=True)
        if not ok:
            self.staging = None
        return ok

    def append(self, spark: Any, rows: pa.Table) -> tuple[int, float]:
        """One job: register, append under the root's lock, follow compaction. Returns (new partitions, seconds)."""
        mapped, specs = self.map.apply(rows)
        mapped = mapped.sort_by(_SORT)
        started = time.monotonic()
        new = self.partitions.register(spark, specs)
        registered = time.monotonic()
        # The lock keeps compaction from swapping a partition between this job's commit and
        # the move of its files into a compacted partition's location (partition_files.py).
        with root_lock(self.root_dir):
            locked = time.monotonic()
            self.on_lock_wait(locked - registered)
            self._write(spark, mapped)
            if self.root_dir is not None:
                self._follow_compaction(spark, specs)
        done = time.monotonic()
        if new:
            log.info("wrote %d rows with %d new partitions in %.1fs (registering %.1fs, waiting for compaction's "
                     "lock %.1fs, writing %.1fs)", mapped.num_rows, new, done - started, registered - started,
                     locked - registered, done - locked)
        return new, done - started

    def _follow_compaction(self, spark: Any, specs: list[tuple[str, str]]) -> None:
        assert self.root_dir is not None
        for value, date in specs:
            pdir = Path(partition_dir(str(self.root_dir), value, date))
            if (pdir / MARKER).exists():
                settle_locked(spark, self.database, PartitionRef(self.importer, value, date, pdir, self.root_dir))

    def _write(self, spark: Any, table: pa.Table) -> None:
        if self.staging is not None and self.doc_encoder is not None and self.root_dir is not None:
            # The staged rows are the table's files already: placed, no Spark job (importer/place.py).
            place(table.append_column(DOC_COLUMN, self.doc_encoder.column(table)), self.staging, self.root_dir)
            return
        if self._configured is not spark:
            for key, value in _NO_SHREDDING.items():
                spark.conf.set(key, value)
            self._configured = spark
        staged: Path | None = None
        try:
            if self.staging is not None:  # without the C encoder: Spark makes `doc` as it writes
                self.staging.mkdir(parents=True, exist_ok=True)
                staged = self.staging / f"{uuid.uuid4().hex}.parquet"
                pq.write_table(table, staged, compression="snappy",
                               row_group_size=max(1024, -(-table.num_rows // _STAGED_ROW_GROUPS)))
                df = with_doc(spark.read.parquet(f"file://{staged}"))
            else:
                df = with_doc(spark.createDataFrame(table))
            df.write.options(**WRITE_OPTIONS).mode("append").partitionBy(*PARTITION_COLUMNS).parquet(self.root)
        finally:
            if staged is not None:
                staged.unlink(missing_ok=True)

    def landed(self, spark: Any, rows: pa.Table) -> bool:
        """Whether the rows' last row of a tracked device is already in the table (a commit the client missed)."""
        tracked = pc.not_equal(rows.column("device"), 0)
        if not pc.any(tracked).as_py():
            return False
        rows = rows.filter(tracked)
        last = rows.slice(rows.num_rows - 1, 1).to_pylist()[0]
        # In its partition (its own, or a stand-in) or in the quarantine, named so that both are pruned to.
        day = last["date"].isoformat()
        where = ({self.map.value(last["app_env"], day), QUARANTINE}, day)
        seq = int(last["seq"])
        return bool(seqs_in_table(spark, self.database, self.importer, int(last["device"]), seq, seq, where))

    def isolate(self, spark: Any, table: pa.Table) -> frozenset[tuple[str, str]]:
        """The (app_env, date) pairs whose rows fail by themselves while others succeed; empty when the
        failure is general (disk full, Spark down), which waiting mends and quarantine would not.

        Checked by halving, without committing anything: the partition's directory can be
        written, its registration is accepted, and its rows can be written to a scratch directory.
        """
        pairs = partitions_of(table)
        bad: list[tuple[str, str]] = []
        todo = [pairs]
        while todo:
            group = todo.pop()
            try:
                self._probe(spark, table, group)
                continue
            except Exception as e:  # any failure marks the group for a closer look
                log.debug("probe of %d partitions failed: %s", len(group), describe(e))
            if len(group) == 1:
                bad.append(group[0])
            else:
                todo += [group[: len(group) // 2], group[len(group) // 2 :]]
        return frozenset() if len(bad) == len(pairs) else frozenset(bad)

    def _probe(self, spark: Any, table: pa.Table, group: list[tuple[str, str]]) -> None:
        wanted = set(group)
        mask = [(a, d.isoformat()) in wanted for a, d in zip(table.column("app_env").to_pylist(),
                                                             table.column("date").to_pylist())]
        rows, specs = self.map.apply(table.filter(pa.array(mask)))
        for value, date in specs:
            path = local_path(partition_dir(self.root, value, date))
            if path is not None:
                path.mkdir(parents=True, exist_ok=True)
                probe = path / f"_probe-{uuid.uuid4().hex}"
                probe.write_bytes(b"")
                probe.unlink()
        self.partitions.forget()
        self.partitions.register(spark, specs)
        scratch = f"{self.root.rsplit('/', 1)[0]}/_staging/probe-{uuid.uuid4().hex}"
        try:
            with_doc(spark.createDataFrame(rows)).write.options(**WRITE_OPTIONS).mode("append") \
                .partitionBy(*PARTITION_COLUMNS).parquet(scratch)
        finally:
            local = local_path(scratch)
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)


class Commit:
    """One Spark job: its rows, its share of the spill, whether it landed; `run` is idempotent."""

    def __init__(self, target: TableTarget, rows: pa.Table, spill: Spill | None = None,
                 share: SpillShare | None = None,
                 on_appended: Callable[[int, float], None] = lambda new, seconds: None) -> None:
        self.target = target
        self.rows = rows
        self.spill = spill
        self.share = share
        self.on_appended = on_appended  # (new partitions, seconds): what the planner learns from
        self.attempts = 0
        self.done = False

    def quarantined(self, pairs: frozenset[tuple[str, str]]) -> Commit:
        """The same job, with the rows of these (app_env, date) pairs moved to the quarantine partition."""
        if not pairs:
            return self
        again = Commit(self.target, quarantined(self.rows, pairs), self.spill, self.share, self.on_appended)
        again.attempts = self.attempts
        return again

    def run(self, spark: Any) -> None:
        """Append the rows once, whatever attempts came before; then the spill's share is done with."""
        if self.done:
            return
        self.attempts += 1
        if self.attempts > 1 and self.target.landed(spark, self.rows):
            log.warning("a job of %d rows had committed although its write reported an error", self.rows.num_rows)
        else:
            self.on_appended(*self.target.append(spark, self.rows))
        # Also after a job found landed: the share of the spill it carried is in the table.
        if self.share is not None and self.spill is not None:
            self.spill.done(*self.share)
        self.done = True


def quarantined(table: pa.Table, pairs: frozenset[tuple[str, str]]) -> pa.Table:
    """The table with the rows of these (app_env, date) pairs moved to the quarantine partition, names kept."""
    names = table.column("app_env").to_pylist()
    moved = [(a, d.isoformat()) in pairs for a, d in zip(names, table.column("date").to_pylist())]
    original = table.column("original_app_env").to_pylist()
    table = table.set_column(table.schema.get_field_index("app_env"), "app_env",
                             pa.array([QUARANTINE if m else a for a, m in zip(names, moved)], pa.string()))
    return table.set_column(table.schema.get_field_index("original_app_env"), "original_app_env",
                            pa.array([a if m else o for a, o, m in zip(names, original, moved)], pa.string()))
