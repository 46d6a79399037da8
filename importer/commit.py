"""One batch's commit into the table, as an idempotent `Commit`.

`TableTarget` is where an importer's rows go and how one commit gets them there
(docs/reliability.md, "The table's commit protocol", says it step by step):
1. Each partition's rows are brought together (importer/place.py `grouped`).
2. The partitions it needs are registered in the catalog (table/catalog.py).
3. Under the root's lock, partitions that retention dropped since (their dir is gone or being
   dropped) are registered again, and the rows become files of the table under this
   importer's own root. When the Spark server reads the same filesystem (checked at start
   with a probe file) the importer writes them itself, one Parquet file per partition with
   `doc` encoded (importer/variant.py), and renames them into place (importer/place.py): no
   Spark job. That is the one local path, with LOGJAM_NATIVE=off too. Only a Spark server
   that does not share the filesystem (the probe fails, or `--no-staging` says so) gets the
   rows inside the Spark Connect request and writes them itself, one job per commit.
4. Still under the lock, each partition written is followed (table/protocol.py `follow`): a
   swap a killed compaction left is settled and the new files move into a compacted
   partition's location, so a committed row is queryable at once.

`Commit` is one batch with everything that belongs to it: its rows, its token (the names of
its files), the share of the spill it carries (importer/spill.py) and how far it got.
`run(spark)` may be called again after any failure and leaves the table as if it ran once: a
placed batch finishes its own list of renames (each file placed once) and is not placed
again once it was; a batch written through Spark first asks the table for its last row, so a
job that committed although its client saw an error is not written twice. The spill's share
is marked done either way (Kafka Connect's sink task is the model: the framework retries,
the write is idempotent).
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
from importer.place import grouped, place, unplaced, unstage
from importer.spill import Spill
from importer.variant import DocEncoder
from table import protocol
from table.catalog import Partitions, seqs_in_table
from table.layout import LOOKUPS, Layout
from table.partitioning import PartitionMap, partitions_of
from table.paths import QUARANTINE, local_path, output_root, partition_dir, staging_dir
from table.schema import DOC_COLUMN, PARTITION_COLUMNS, WRITE_OPTIONS, with_doc

log = logging.getLogger(__name__)

# An importer writes `doc` unshredded: shredding it at ingest halved the rows/s of Spark's write
# (measured, docs/schema.md); the day's closing merge shreds it.
_NO_SHREDDING = {"spark.sql.variant.writeShredding.enabled": "false"}

SpillShare = tuple[Path, "pa.Table | None"]  # a spill file and what stays in it once the job committed


class TableTarget:
    """One importer's part of the table: its root, its partitions, and how a commit lands there."""

    def __init__(self, database: str, importer: int, location: str, *, staging: bool = True,
                 partition_map: PartitionMap | None = None,
                 on_lock_wait: Callable[[float], None] = lambda seconds: None, layout: Layout = LOOKUPS) -> None:
        self.database = database
        self.layout = layout  # how placed files are written (table/layout.py)
        self.importer = importer
        self.on_lock_wait = on_lock_wait
        self.root = output_root(location, importer)
        self.root_dir = local_path(self.root)
        self.partitions = Partitions(database, importer, self.root)
        self.map = partition_map or PartitionMap(importer)
        self.staging_path = staging_dir(location, importer)
        self.staging_dir = local_path(self.staging_path)
        # Where placed batches are staged; None: the rows go inside the Spark request.
        self.staging: Path | None = self.staging_dir if staging and self.root_dir is not None else None
        self._configured: Any = None  # the session _NO_SHREDDING was set in
        self.doc_encoder = DocEncoder.load()

    @property
    def places(self) -> bool:
        """Whether commits place their own files (the local path) rather than go through a Spark job."""
        return self.staging is not None

    def probe_staging(self, spark: Any) -> bool:
        """Keep placing files only if Spark reads back a file staged here (same filesystem on both sides).

        First the batches a killed run left listed are finished (table/protocol.py), so that the
        table's max(seq) read after this counts them whole."""
        if self.staging_dir is not None and self.root_dir is not None:
            finished = protocol.recover_placements(self.staging_dir, self.root_dir,
                                                   lambda dirs: self._ensure_dirs(spark, dirs, {}))
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
            if not _answers(spark):
                # Spark went away meanwhile (a restart): no verdict on the filesystem. Choosing the
                # Spark path now would slow this importer for its whole life; its start fails instead.
                raise
            log.info("placing files in %s is not possible (%s); sending batches inside the Spark request",
                     self.staging, describe(e))
            ok = False
        finally:
            path.unlink(missing_ok=True)
        if not ok:
            self.staging = None
        return ok

    def append(self, spark: Any, rows: pa.Table, commit: Commit) -> tuple[int, float]:
        """Register, write under the root's lock, follow compaction. Returns (new partitions, seconds)."""
        mapped, specs = self.map.apply(rows)
        mapped = grouped(mapped)
        started = time.monotonic()
        new = self.partitions.register(spark, specs)
        registered = time.monotonic()
        dirs = {Path(partition_dir(str(self.root_dir), v, d)): (v, d) for v, d in specs} if self.root_dir else {}
        # The lock keeps compaction from swapping, and retention from dropping, a partition between
        # this commit's renames and the move of its files into a compacted partition's location.
        with protocol.root_lock(self.root_dir):
            locked = time.monotonic()
            self.on_lock_wait(locked - registered)
            if self.places:
                if not commit.placed:
                    assert self.staging is not None and self.root_dir is not None
                    doc = self.doc_encoder.column(mapped)
                    place(mapped.append_column(DOC_COLUMN, doc), self.staging, self.root_dir, commit.token,
                          lambda missing: self._ensure_dirs(spark, missing, dirs), commit.replaces, self.layout)
                    commit.placed = True
            else:
                self._ensure_dirs(spark, list(dirs), dirs)
                self._write(spark, mapped)
            if self.root_dir is not None:
                for pdir, (value, date) in dirs.items():
                    if (pdir / protocol.MARKER).exists():
                        protocol.follow(spark, self.database,
                                        protocol.PartitionRef(self.importer, value, date, pdir, self.root_dir))
        done = time.monotonic()
        if new:
            log.info("wrote %d rows with %d new partitions in %.1fs (registering %.1fs, waiting for compaction's "
                     "lock %.1fs, writing %.1fs)", mapped.num_rows, new, done - started, registered - started,
                     locked - registered, done - locked)
        return new, done - started

    def _ensure_dirs(self, spark: Any, pdirs: list[Path], specs: dict[Path, tuple[str, str]]) -> None:
        """With the root lock held: register again the partitions retention dropped since they were registered
        (their dir is gone, or marked dropping by a drop that did not finish)."""
        if self.root_dir is None:
            return
        missing = protocol.missing_dirs(pdirs)
        if not missing:
            return
        refs = [protocol.partition_at(self.importer, self.root_dir, d, specs.get(d)) for d in missing]
        dropping = [r for r in refs if protocol.is_dropping(r.dir)]
        if dropping:
            protocol.finish_drop(spark, self.database, dropping)  # its `_dropped-*` is reaped by retention or a start
        again = [(r.app_env, r.date) for r in refs]
        self.partitions.forget(again)
        self.partitions.register(spark, again)
        log.info("registered %d partitions again that retention had dropped", len(again))

    def _write(self, spark: Any, table: pa.Table) -> None:
        """One Spark job with the rows inside the request: for a Spark server on another filesystem."""
        if self._configured is not spark:
            for key, value in _NO_SHREDDING.items():
                spark.conf.set(key, value)
            self._configured = spark
        df = with_doc(spark.createDataFrame(table))
        df.write.options(**WRITE_OPTIONS).mode("append").partitionBy(*PARTITION_COLUMNS).parquet(self.root)

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
        scratch = f"{self.staging_path}/probe-{uuid.uuid4().hex}"  # removed at start if a kill leaves it
        try:
            if self.places:
                local = local_path(scratch)
                assert local is not None
                local.mkdir(parents=True)
                pq.write_table(rows.append_column(DOC_COLUMN, self.doc_encoder.column(rows)), local / "rows.parquet")
            else:
                with_doc(spark.createDataFrame(rows)).write.options(**WRITE_OPTIONS).mode("append") \
                    .partitionBy(*PARTITION_COLUMNS).parquet(scratch)
        finally:
            local = local_path(scratch)
            if local is not None:
                shutil.rmtree(local, ignore_errors=True)


class Commit:
    """One batch: its rows, its token, its share of the spill, how far it got; `run` is idempotent."""

    def __init__(self, target: TableTarget, rows: pa.Table, spill: Spill | None = None,
                 share: SpillShare | None = None,
                 on_appended: Callable[[int, float], None] = lambda new, seconds: None) -> None:
        self.target = target
        self.rows = rows
        self.spill = spill
        self.share = share
        self.on_appended = on_appended  # (new partitions, seconds): what the planner learns from
        self.token = uuid.uuid4().hex  # its placed files are named after it (importer/place.py)
        self.replaces: str | None = None  # the token of a listed batch whose unplaced rest this one carries
        self.placed = False  # every file of it renamed into its partition
        self.attempts = 0
        self.done = False

    def quarantined(self, pairs: frozenset[tuple[str, str]]) -> Commit:
        """The same batch, with the rows of these (app_env, date) pairs moved to the quarantine partition.

        A placed batch whose list of renames is under way carries on with only the rows it has not
        placed yet, under a new token whose list, once durable, abandons the old one's rest."""
        if not pairs:
            return self
        rows, replaces = self.rows, None
        staging = self.target.staging
        if self.target.places and not self.placed and staging is not None:
            waiting = unplaced(staging, self.token)
            if waiting is None:
                unstage(staging, self.token)  # staged, never listed: nothing of it was placed
            else:
                rows, replaces = self._not_placed(waiting), self.token
        again = Commit(self.target, quarantined(rows, pairs), self.spill, self.share, self.on_appended)
        again.attempts, again.replaces = self.attempts, replaces
        return again

    def _not_placed(self, waiting: set[Path]) -> pa.Table:
        root = self.target.root_dir
        mapped, _ = self.target.map.apply(self.rows)
        keep = [Path(partition_dir(str(root), a, d.isoformat())) in waiting
                for a, d in zip(mapped.column("app_env").to_pylist(), mapped.column("date").to_pylist())]
        return self.rows.filter(pa.array(keep))

    def run(self, spark: Any) -> None:
        """Commit the rows once, whatever attempts came before; then the spill's share is done with."""
        if self.done:
            return
        self.attempts += 1
        if not self.target.places and self.attempts > 1 and self.target.landed(spark, self.rows):
            log.warning("a job of %d rows had committed although its write reported an error", self.rows.num_rows)
        elif self.rows.num_rows:
            self.on_appended(*self.target.append(spark, self.rows, self))
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


def _answers(spark: Any) -> bool:
    """Whether the Spark session still runs a query at all."""
    try:
        spark.sql("SELECT 1").collect()
        return True
    except Exception:
        return False
