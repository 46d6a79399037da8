"""The write stage: batches become commits, written in a thread of their own, in order, retried until they land.

The stage has three parts, a module each:
- planning (importer/plan.py): a batch becomes a `Commit`, within the budget of new
  partitions a job may register; the rest of a burst of new streams waits in the spill;
- the commit (importer/commit.py): one batch with its rows, its token, its share of the spill
  and how far it got (placed files, or a Spark job for a remote Spark); `run(spark)` is
  idempotent;
- the retry thread (here): `BackgroundWriter` runs the commits in order while the main thread
  decodes the next batch, and only retries them.

A failed attempt is retried with backoff on a new session: first whatever the old session
still runs is interrupted, then the commit runs again (and finds out itself whether the failed
attempt had committed after all). After every few failed attempts the writer looks for the
rows that fail by themselves (a partition whose directory or registration is refused) while
the others would succeed; those go to the quarantine partition and the rest lands. A failure
of everything (disk full, Spark down) is waited out. A write that runs longer than
`--write-timeout` is reported as stalled and interrupted, which makes it a failed attempt.
After a batch has been given up (failed writes at shutdown) later batches are dropped too, so
that the table is always a prefix of what was submitted.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from importer.batch import Batch
from importer.commit import Commit, TableTarget
from importer.failures import describe
from importer.plan import Planner
from importer.spill import Spill
from table.layout import LOOKUPS, Layout
from table.partitioning import PartitionMap
from table.paths import QUARANTINE

log = logging.getLogger(__name__)


class WriteFailed(RuntimeError):
    """A batch could not be written before shutdown; its rows are lost to this run."""


class TableWriter:
    """Writes batches of one importer into the catalog table: plans, then commits (its own placed
    files, or rows sent to Spark when `staging` is off)."""

    def __init__(self, database: str, importer: int, location: str, *, staging: bool = True,
                 partition_map: PartitionMap | None = None, spill_dir: Path | None = None,
                 on_lock_wait: Callable[[float], None] = lambda seconds: None, layout: Layout = LOOKUPS) -> None:
        self.target = TableTarget(database, importer, location, staging=staging, partition_map=partition_map,
                                  on_lock_wait=on_lock_wait, layout=layout)
        self.spill = Spill(spill_dir) if spill_dir is not None else None
        self.planner = Planner(self.target, self.spill)
        self._loaded = False
        self.root, self.map, self.doc_encoder = self.target.root, self.target.map, self.target.doc_encoder

    def probe_staging(self, spark: Any) -> bool:
        return self.target.probe_staging(spark)

    def plan(self, spark: Any, table: pa.Table) -> Commit:
        """The Commit that writes this batch (the first one also loads what the catalog knows)."""
        if not self._loaded:
            self.target.map.load(spark, self.target.database)
            if self.spill is not None:
                self.spill.prune(spark, self.target.database, self.target.importer)
            self._loaded = True
        return self.planner.plan(table)

    def write(self, spark: Any, table: pa.Table) -> None:
        """Plan and commit one batch now, in this thread (tools and tests; the importer uses BackgroundWriter)."""
        self.plan(spark, table).run(spark)


class WriteListener:
    """What the write stage tells the worker (the framework owns progress: it persists after
    `committed`). Each hook does nothing unless overridden."""

    def written(self, batch: Batch, seconds: float) -> None:
        """A batch was committed, in `seconds` of attempts."""

    def write_failed(self, error: BaseException) -> None:
        """An attempt failed; it will be retried."""

    def committed(self, batch: Batch) -> None:
        """This batch and every earlier one are in the table (called in the writer's thread)."""

    def quarantined(self, batch: Batch, pairs: frozenset[tuple[str, str]]) -> None:
        """Rows of these (app_env, date) pairs went to the quarantine partition."""


class BackgroundWriter:
    """One thread that writes batches in order; at most one batch waits while another is written."""

    def __init__(
        self,
        connect: Callable[[], Any],
        table_writer: TableWriter,
        *,
        listener: WriteListener | None = None,
        stop: threading.Event | None = None,
        max_backoff: float = 10.0,
        final_attempts: int = 3,
        quarantine_after: int = 4,
    ) -> None:
        self._connect = connect
        self.table_writer = table_writer
        self._queue: queue.Queue[Batch | None] = queue.Queue(maxsize=1)
        self._listener = listener or WriteListener()
        self.failed = False
        self._stop = stop or threading.Event()
        self._closing = threading.Event()
        self._max_backoff = max_backoff
        self._final_attempts = final_attempts
        self._quarantine_after = quarantine_after
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
            raise WriteFailed(f"{self.lost_rows} rows could not be written to {self.table_writer.root}")

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
                    self._listener.committed(batch)
            finally:
                with self._lock:
                    self._inflight -= 1
                self.done.set()

    def _write(self, batch: Batch) -> bool:
        attempt = 0
        backoff = 0.5
        commit: Commit | None = None
        quarantine: frozenset[tuple[str, str]] = frozenset()
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                if self.spark is None:
                    self.spark = self._connect()
                self.started = started
                if commit is None:
                    commit = self.table_writer.plan(self.spark, batch.table)
                commit.run(self.spark)
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
                            batch.rows, self.table_writer.root, attempt, backoff, self.last_error)
                # Whatever the old session still runs must not commit behind our retry.
                self.interrupt()
                # A restarted Connect server no longer knows our session: start a new one.
                self.spark = None
                time.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                if commit is not None and attempt % self._quarantine_after == 0 and not closing:
                    quarantine = self._isolate(commit.rows, quarantine)
                    commit = commit.quarantined(quarantine)
                continue
            self.started = None
            self.failing_since, self.last_error = None, None
            self.written_rows += batch.rows
            if quarantine:
                self._listener.quarantined(batch, quarantine)
            self._listener.written(batch, time.monotonic() - started)
            return True

    def _failed(self, e: BaseException) -> None:
        self.last_error = describe(e)
        if self.failing_since is None:
            self.failing_since = time.monotonic()
        self._listener.write_failed(e)

    def _isolate(self, rows: pa.Table, known: frozenset[tuple[str, str]]) -> frozenset[tuple[str, str]]:
        """After repeated failures: find the rows that fail by themselves, so the rest can land."""
        try:
            if self.spark is None:
                self.spark = self._connect()
            bad = self.table_writer.target.isolate(self.spark, rows)
        except Exception as e:  # Spark itself is failing: nothing to single out
            log.debug("could not look for failing partitions: %s", describe(e))
            return known
        if bad - known:
            log.error("quarantining the rows of %d stream(s) whose writes keep failing while others succeed "
                      "(%s); they land in app_env='%s' with their name in original_app_env",
                      len(bad), ", ".join(f"{a}/{d}" for a, d in sorted(bad)[:5]), QUARANTINE)
        return known | bad
