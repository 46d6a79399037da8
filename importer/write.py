"""The write stage: one Spark job per batch, in a thread of its own, in order, retried until it commits.

How a batch gets into the table (`TableWriter.write`):
1. Its rows are sorted by (app_env, date) and staged as one Parquet file under the table's
   `_staging/` directory, when the Spark server reads the same filesystem (checked at start
   with a probe file); otherwise they travel inside the Spark Connect request
   (`createDataFrame`), which is slower and holds the whole batch in the server's heap.
   A staged file carries `doc` already encoded (importer/variant.py, in C); otherwise Spark
   parses the bodies into `doc` as it writes (`with_doc`).
2. The partitions it needs are registered in the catalog (table/catalog.py).
3. Spark reads the staged file and appends it, partitioned by app_env and date, under this
   importer's own root: one job, whose file committer moves the files into place at job
   commit, so a batch is in the table whole or not at all.
Sorting first matters: Spark sorts rows by partition before writing, and pre-sorted input
cut its CPU per row by about 30% (16 against 23 us, measured). The staged file's row groups
are small enough that Spark splits it into one task per core.

`BackgroundWriter` runs that in a thread while the main thread decodes the next batch.
A failed attempt is retried with backoff on a new session: first whatever the old session
still runs is interrupted, then the batch's last row is looked up, so a write that did
commit although its client saw an error is not written twice. After every few failed
attempts the writer looks for the rows that fail by themselves (a partition whose directory
or registration is refused) while the others would succeed; those go to the quarantine
partition and the rest lands. A failure of everything (disk full, Spark down) is waited out. A write that runs longer
than `--write-timeout` is reported as stalled and interrupted, which makes it a failed
attempt. After a batch has been given up (failed writes at shutdown) later batches are
dropped too, so that the table is always a prefix of what was submitted.
"""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from importer.batch import Batch
from table.catalog import Partitions
from table.compaction_protocol import PartitionRef, settle_locked
from importer.failures import describe
from table.partition_files import MARKER, root_lock
from table.partitioning import PartitionMap, partitions_of
from table.paths import QUARANTINE, local_path, output_root, partition_dir, staging_dir
from importer.spill import Spill
from importer.variant import DocEncoder
from table.schema import DOC_COLUMN, PARTITION_COLUMNS, WRITE_OPTIONS, qualified, sql_string, staged_ddl, with_doc

log = logging.getLogger(__name__)

_SORT = [("app_env", "ascending"), ("date", "ascending")]
# New partitions one Spark job may register: a burst of new streams waits in the spill, so the
# streams that flow keep landing. A new partition costs a metastore registration and a file of
# its own: 2-3 ms each on a quiet machine, ten times that on a busy one, so the budget follows
# what the last jobs cost, aiming at NEW_PARTITION_JOB_SECONDS a job. Two such jobs, one under
# way and the one a row rides in, plus the 2 s group commit, keep a flowing stream within 10 s.
NEW_PARTITIONS_PER_JOB = 100  # the first job's budget
NEW_PARTITIONS_RANGE = (16, 2000)
NEW_PARTITION_JOB_SECONDS = 2.5
# Row groups per staged file: Spark splits a file only between row groups.
_STAGED_ROW_GROUPS = 16
# An importer writes `doc` unshredded: shredding it at ingest halved the rows/s of Spark's write
# (measured, docs/schema.md); compaction's rewrite shreds it (its session keeps Spark's default).
_NO_SHREDDING = {"spark.sql.variant.writeShredding.enabled": "false"}


class NewPartitionBudget:
    """How many new partitions the next job may take, so that such a job takes about `seconds`."""

    def __init__(self, seconds: float = NEW_PARTITION_JOB_SECONDS) -> None:
        self.seconds = seconds
        self.allowed = NEW_PARTITIONS_PER_JOB

    def observe(self, new: int, seconds: float) -> None:
        """Learn from a job that took all it was allowed (a burst): only those say what a partition costs."""
        if new < self.allowed or seconds <= 0:
            return
        # The geometric mean of the last budget and the one this job asks for damps the noise
        # of a shared machine; the job's fixed cost makes it converge below `seconds`, not past it.
        wanted = new * self.seconds / seconds
        low, high = NEW_PARTITIONS_RANGE
        self.allowed = max(low, min(high, round((self.allowed * wanted) ** 0.5)))


class WriteFailed(RuntimeError):
    """A batch could not be written before shutdown; its rows are lost to this run."""


class TableWriter:
    """Writes batches of one importer into the catalog table, through Spark."""

    def __init__(self, database: str, importer: int, location: str, *, staging: bool = True,
                 partition_map: PartitionMap | None = None, spill_dir: Path | None = None,
                 on_lock_wait: Callable[[float], None] = lambda seconds: None) -> None:
        self.database = database
        self.on_lock_wait = on_lock_wait
        self.importer = importer
        self.root = output_root(location, importer)
        self.root_dir = local_path(self.root)
        self.partitions = Partitions(database, importer, self.root)
        self.map = partition_map or PartitionMap(importer)
        self.spill = Spill(spill_dir) if spill_dir is not None else None
        self._loaded = False
        self._plan: tuple[pa.Table, pa.Table, tuple[Path, pa.Table | None] | None] | None = None
        self.budget = NewPartitionBudget()
        staged = local_path(staging_dir(location, importer)) if staging else None
        self.staging: Path | None = staged
        self._configured: Any = None  # the session _NO_SHREDDING was set in
        self.doc_encoder = DocEncoder.load() if staged else None

    def probe_staging(self, spark: Any) -> bool:
        """Keep staging only if Spark reads back a file staged here (same filesystem on both sides)."""
        if self.staging is None:
            return False
        token = uuid.uuid4().hex
        path = self.staging / f"probe-{token}.parquet"
        try:
            self.staging.mkdir(parents=True, exist_ok=True)
            for stale in self.staging.glob("*.parquet"):
                stale.unlink(missing_ok=True)  # a crashed run's batches: replay brings their rows back
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

    def write(self, spark: Any, table: pa.Table, quarantine: frozenset[tuple[str, str]] = frozenset(),
              retry: bool = False) -> None:
        """Write one batch in one Spark job; rows of the (app_env, date) pairs in `quarantine` go to the quarantine.

        A job registers at most `self.budget.allowed` new partitions, so that a burst of new
        streams never holds up the streams that already flow: the rest of the burst waits in
        the spill (importer/spill.py), durably, and each later job takes a share of it. A retry
        of the same batch repeats the same job, and skips it if it had committed after all.
        """
        if not self._loaded:
            self.map.load(spark, self.database)
            if self.spill is not None:
                self.spill.prune(spark, self.database, self.importer)
            self._loaded = True
        if self._plan is None or self._plan[0] is not table or not retry:
            self._plan = (table, *self._plan_job(table))
        _, job, taken = self._plan
        if quarantine:
            job = quarantined(job, quarantine)
        if retry and self.landed(spark, job):
            log.warning("a job of %d rows had committed although its write reported an error", job.num_rows)
        else:
            mapped, specs = self.map.apply(job)
            self._commit(spark, mapped.sort_by(_SORT), specs)
        # Also after a job found landed: the share of the spill it carried is in the table.
        if taken is not None and self.spill is not None:
            self.spill.done(*taken)
        self._plan = None

    def _plan_job(self, table: pa.Table) -> tuple[pa.Table, tuple[Path, pa.Table | None] | None]:
        """This batch's job: its rows within the new-partition budget, plus a share of the spill if it has room."""
        allowed = self.budget.allowed
        job, later, used = self._share(table, allowed)
        if later is not None:
            if self.spill is None:
                return table, None
            self.spill.put(later)  # durable before the job commits the rows that arrived after these
            log.info("%d rows of new streams wait for their partitions (%d new in this job; %d rows waiting)",
                     later.num_rows, used, self.spill.rows)
            return job, None
        head = self.spill.head() if self.spill is not None and used < allowed else None
        if head is None:
            return job, None
        path, spilled = head
        share, rest, _ = self._share(spilled, allowed - used)
        return pa.concat_tables([share, job]), (path, rest)

    def _share(self, table: pa.Table, budget: int) -> tuple[pa.Table, pa.Table | None, int]:
        """(rows of registered partitions and of the first `budget` new ones, the other rows or None, new ones used)."""
        pairs = partitions_of(table)
        new = [p for p in pairs if not self.partitions.is_registered((self.map.value(*p), p[1]))]
        if len(new) <= budget:
            return table, None, len(new)
        order: dict[tuple[str, str], int] = {}
        keys = list(zip(table.column("app_env").to_pylist(), (d.isoformat() for d in table.column("date").to_pylist())))
        wanted = set(new)
        for key in keys:
            if key in wanted and key not in order:
                order[key] = len(order)
        late = {k for k, i in order.items() if i >= budget}
        mask = pa.array([k not in late for k in keys])
        return table.filter(mask), table.filter(pc.invert(mask)), budget

    def _commit(self, spark: Any, table: pa.Table, specs: list[tuple[str, str]]) -> None:
        started = time.monotonic()
        new = self.partitions.register(spark, specs)
        registered = time.monotonic()
        # The lock keeps compaction from swapping a partition between this job's commit and
        # the move of its files into a compacted partition's location (partition_files.py).
        with root_lock(self.root_dir):
            locked = time.monotonic()
            self.on_lock_wait(locked - registered)
            self._write(spark, table)
            if self.root_dir is not None:
                self._follow_compaction(spark, specs)
        done = time.monotonic()
        self.budget.observe(new, done - started)
        if new:
            log.info("wrote %d rows with %d new partitions in %.1fs (registering %.1fs, waiting for compaction's "
                     "lock %.1fs, writing %.1fs)", table.num_rows, new, done - started, registered - started,
                     locked - registered, done - locked)

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

    def _follow_compaction(self, spark: Any, specs: list[tuple[str, str]]) -> None:
        assert self.root_dir is not None
        for value, date in specs:
            pdir = Path(partition_dir(str(self.root_dir), value, date))
            if (pdir / MARKER).exists():
                settle_locked(spark, self.database, PartitionRef(self.importer, value, date, pdir, self.root_dir))

    def _write(self, spark: Any, table: pa.Table) -> None:
        if self._configured is not spark:
            for key, value in _NO_SHREDDING.items():
                spark.conf.set(key, value)
            self._configured = spark
        staged: Path | None = None
        try:
            if self.staging is not None:
                self.staging.mkdir(parents=True, exist_ok=True)
                staged = self.staging / f"{uuid.uuid4().hex}.parquet"
                if self.doc_encoder is not None:
                    table = table.append_column(DOC_COLUMN, self.doc_encoder.column(table))
                pq.write_table(table, staged, compression="snappy",
                               row_group_size=max(1024, -(-table.num_rows // _STAGED_ROW_GROUPS)))
                df = spark.read.schema(staged_ddl()).parquet(f"file://{staged}") if self.doc_encoder is not None \
                    else with_doc(spark.read.parquet(f"file://{staged}"))
            else:
                df = with_doc(spark.createDataFrame(table))
            df.write.options(**WRITE_OPTIONS).mode("append").partitionBy(*PARTITION_COLUMNS).parquet(self.root)
        finally:
            if staged is not None:
                staged.unlink(missing_ok=True)

    def landed(self, spark: Any, table: pa.Table) -> bool:
        """Whether the table's last row of a tracked device is already in the table (a commit the client missed)."""
        devices = table.column("device")
        tracked = pc.not_equal(devices, 0)
        if not pc.any(tracked).as_py():
            return False
        rows = table.filter(tracked)
        last = rows.slice(rows.num_rows - 1, 1).to_pylist()[0]
        # In its partition (its own, or a stand-in) or in the quarantine, named so that both are pruned to.
        day = last["date"].isoformat()
        values = {self.map.value(last["app_env"], day), QUARANTINE}
        found = spark.sql(
            f"SELECT 1 FROM {qualified(self.database)} WHERE importer = {self.importer} "
            f"AND app_env IN ({', '.join(repr_sql(v) for v in sorted(values))}) AND date = DATE'{day}' "
            f"AND device = {int(last['device'])} AND seq = {int(last['seq'])} LIMIT 1").collect()
        return bool(found)


def repr_sql(text: str) -> str:
    return f"'{sql_string(text)}'"


def quarantined(table: pa.Table, pairs: frozenset[tuple[str, str]]) -> pa.Table:
    """The table with the rows of these (app_env, date) pairs moved to the quarantine partition, names kept."""
    names = table.column("app_env").to_pylist()
    moved = [(a, d.isoformat()) in pairs for a, d in zip(names, table.column("date").to_pylist())]
    original = table.column("original_app_env").to_pylist()
    table = table.set_column(table.schema.get_field_index("app_env"), "app_env",
                             pa.array([QUARANTINE if m else a for a, m in zip(names, moved)], pa.string()))
    return table.set_column(table.schema.get_field_index("original_app_env"), "original_app_env",
                            pa.array([a if m else o for a, o, m in zip(names, original, moved)], pa.string()))


class BackgroundWriter:
    """One thread that writes batches in order; at most one batch waits while another is written."""

    def __init__(
        self,
        connect: Callable[[], Any],
        writer: TableWriter,
        *,
        on_written: Callable[[Batch, float], None] = lambda batch, seconds: None,
        on_failure: Callable[[BaseException], None] = lambda e: None,
        on_committed: Callable[[Batch], None] = lambda batch: None,
        stop: threading.Event | None = None,
        max_backoff: float = 10.0,
        final_attempts: int = 3,
        quarantine_after: int = 4,
        on_quarantine: Callable[[Batch, frozenset[tuple[str, str]]], None] = lambda batch, pairs: None,
    ) -> None:
        self._connect = connect
        self.writer = writer
        self._queue: queue.Queue[Batch | None] = queue.Queue(maxsize=1)
        self._on_written = on_written
        self._on_failure = on_failure
        self._on_committed = on_committed
        self.failed = False
        self._stop = stop or threading.Event()
        self._closing = threading.Event()
        self._max_backoff = max_backoff
        self._final_attempts = final_attempts
        self._quarantine_after = quarantine_after
        self._on_quarantine = on_quarantine
        self.failing_since: float | None = None  # monotonic time of the first of the failures in a row
        self.last_error: str | None = None  # what the last failed attempt was about (importer/failures.py)
        self.spark: Any = None
        self.lost_rows = 0
        self.written_rows = 0
        self._inflight = 0
        self.started: float | None = None  # monotonic start of the Spark call under way
        self._lock = threading.Lock()
        self.done = threading.Event()  # set whenever a batch finishes (the main loop waits on it)
        self._thread = threading.Thread(target=self._run, name="spark-writer", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Batches submitted and not yet written (queued or in Spark)."""
        return self._inflight

    @property
    def idle(self) -> bool:
        return self._inflight == 0

    @property
    def has_room(self) -> bool:
        return self._inflight < 2

    def submit(self, batch: Batch) -> bool:
        """Queue a batch, blocking while the queue is full. Returns False only if the writer died."""
        with self._lock:
            self._inflight += 1
        while True:
            if not self._thread.is_alive():
                return False
            try:
                self._queue.put(batch, timeout=0.2)
                return True
            except queue.Full:
                continue

    def interrupt(self) -> None:
        """Cancel the Spark operation under way (from another thread): it then fails and is retried."""
        spark = self.spark
        if spark is not None and hasattr(spark, "interruptAll"):
            try:
                spark.interruptAll()
            except Exception as e:  # a dead session cannot be interrupted, and needs not be
                log.debug("interrupting the stalled write: %s", e)

    def close(self, timeout: float | None = None) -> None:
        """Write everything queued, then stop the thread. Raises WriteFailed if rows were lost."""
        self._closing.set()
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.2)
                break
            except queue.Full:
                continue
        self._thread.join(timeout)
        if self.lost_rows:
            raise WriteFailed(f"{self.lost_rows} rows could not be written to {self.writer.root}")

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            try:
                if self.failed:
                    log.error("dropping a batch of %d rows behind a batch that could not be written", batch.rows)
                    self.lost_rows += batch.rows
                elif self._write(batch):
                    self._on_committed(batch)
            finally:
                with self._lock:
                    self._inflight -= 1
                self.done.set()

    def _write(self, batch: Batch) -> bool:
        attempt = 0
        backoff = 0.5
        quarantine: frozenset[tuple[str, str]] = frozenset()
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                if self.spark is None:
                    self.spark = self._connect()
                self.started = started
                # A retry skips a job that committed after all (TableWriter.write checks), and
                # still marks the share of the spill it carried as done.
                self.writer.write(self.spark, batch.table, quarantine, retry=attempt > 1)
            except Exception as e:  # Spark reports server, network and data problems with many types
                self.started = None
                self._failed(e)
                closing = self._closing.is_set() or self._stop.is_set()
                if closing and attempt >= self._final_attempts:
                    log.error("giving up on a batch of %d rows after %d attempts: %s", batch.rows, attempt, describe(e))
                    self.lost_rows += batch.rows
                    self.failed = True
                    return False
                log.warning("writing %d rows to %s failed (attempt %d), retrying in %.1fs: %s",
                            batch.rows, self.writer.root, attempt, backoff, self.last_error)
                # Whatever the old session still runs must not commit behind our retry.
                self.interrupt()
                # A restarted Connect server no longer knows our session: start a new one.
                self.spark = None
                time.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                if attempt % self._quarantine_after == 0 and not closing:
                    quarantine = self._isolate(batch, quarantine)
                continue
            self.started = None
            self.failing_since, self.last_error = None, None
            self.written_rows += batch.rows
            if quarantine:
                self._on_quarantine(batch, quarantine)
            self._on_written(batch, time.monotonic() - started)
            return True

    def _failed(self, e: BaseException) -> None:
        self.last_error = describe(e)
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        self._on_failure(e)

    def _isolate(self, batch: Batch, known: frozenset[tuple[str, str]]) -> frozenset[tuple[str, str]]:
        """After repeated failures: find the rows that fail by themselves, so the rest can land."""
        try:
            if self.spark is None:
                self.spark = self._connect()
            bad = self.writer.isolate(self.spark, batch.table)
        except Exception as e:  # Spark itself is failing: nothing to single out
            log.debug("could not look for failing partitions: %s", describe(e))
            return known
        if bad - known:
            log.error("quarantining the rows of %d stream(s) whose writes keep failing while others succeed "
                      "(%s); they land in app_env='%s' with their name in original_app_env",
                      len(bad), ", ".join(f"{a}/{d}" for a, d in sorted(bad)[:5]), QUARANTINE)
        return known | bad
