"""Spark sessions for importers and logjam-sql, and the background writer that appends batches.

`--spark` picks the session: `sc://...` is a Spark Connect client (the default, a thin
client of `logjam-spark`); anything else (`local[*]`, `spark://host:7077`, `yarn`) is a
master URL for a classic in-process session, which costs a JVM per process.

`BackgroundWriter` lets the importer decode the next batch while Spark writes the
previous one. Its queue holds at most `depth` batches; when Spark is slower than the
stream, `submit` blocks, the SUB socket fills up, and its high-water mark drops messages,
which the gap tracker then reports (or replay fills). Memory stays bounded either way.

Batches are written strictly in submission order, one Spark job each, and each may carry
a checkpoint mark that `on_committed` receives once the batch is committed. After a batch
has been given up (failed writes at shutdown), later batches are dropped too, so that
what is in the table is always a prefix of what was submitted (recovery relies on that).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable

import pyarrow as pa

from importer.paths import default_warehouse, normalise_warehouse
from importer.schema import PARTITION_COLUMNS

log = logging.getLogger(__name__)

DEFAULT_SPARK = "sc://127.0.0.1:15002"
WAREHOUSE_CONF = "spark.sql.warehouse.dir"


def is_connect(url: str) -> bool:
    return url.startswith("sc://")


def with_session_id(url: str, session_id: str) -> str:
    """`sc://host:port` with a chosen Connect session id (a UUID4), keeping any other parameters."""
    return f"{url};session_id={session_id}" if "/;" in url else f"{url.rstrip('/')}/;session_id={session_id}"


def open_session(url: str, *, app_name: str = "logjam", warehouse: str | None = None,
                 session_id: str | None = None) -> Any:
    """A SparkSession for `url`. Classic sessions get `warehouse` (or the default) as their warehouse dir.

    `session_id` (Connect only) names the server-side session, so that a later process can
    find the operations this one left running (see `importer.recovery.quiesce_previous_session`).
    """
    from pyspark.sql import SparkSession

    if is_connect(url):
        return SparkSession.builder.remote(with_session_id(url, session_id) if session_id else url).create()
    # A master URL was asked for explicitly; a Connect mode inherited from the environment
    # (a parent process that used Spark Connect exports this) would override it.
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE"):
        os.environ.pop(name, None)
    builder = (
        SparkSession.builder.master(url)
        .appName(app_name)
        .config(WAREHOUSE_CONF, warehouse or default_warehouse())
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.catalogImplementation", "in-memory")
        .config("spark.ui.enabled", "false")
    )
    if url.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    return builder.getOrCreate()


def resolve_warehouse(spark: Any, explicit: str | None) -> str:
    """`--warehouse` if given, else the session's own warehouse dir (for Connect: the server's, which
    `logjam-spark` sets to `<data dir>/warehouse`). The path is where the Spark *server* writes."""
    if explicit:
        return normalise_warehouse(explicit)
    value = spark.conf.get(WAREHOUSE_CONF)
    if value.startswith("file:"):
        # file:/abs/path or file:///abs/path; both are the local path.
        value = "/" + value[len("file:"):].lstrip("/")
    return value.rstrip("/")


def write_batch(spark: Any, table: pa.Table, root: str) -> None:
    """Append one Arrow batch under `root`, partitioned by app_env and date."""
    spark.createDataFrame(table).write.mode("append").partitionBy(*PARTITION_COLUMNS).parquet(root)


class WriteFailed(RuntimeError):
    """A batch could not be written before shutdown; its rows are lost."""


class BackgroundWriter:
    """One thread that writes batches in order; at most `depth` batches wait for it."""

    def __init__(
        self,
        connect: Callable[[], Any],
        root: str,
        *,
        depth: int = 1,
        on_written: Callable[[int, float], None] = lambda rows, seconds: None,
        on_failure: Callable[[BaseException], None] = lambda e: None,
        on_committed: Callable[[Any], None] = lambda mark: None,
        stop: threading.Event | None = None,
        max_backoff: float = 10.0,
        final_attempts: int = 3,
    ) -> None:
        self._connect = connect
        self.root = root
        self._queue: queue.Queue[tuple[pa.Table, Any] | None] = queue.Queue(maxsize=depth)
        self._on_written = on_written
        self._on_failure = on_failure
        self._on_committed = on_committed
        self.failed = False
        self._stop = stop or threading.Event()
        self._closing = threading.Event()
        self._max_backoff = max_backoff
        self._final_attempts = final_attempts
        self.spark: Any = None
        self.lost_rows = 0
        self.written_rows = 0
        self._inflight = 0
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="spark-writer", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Batches submitted and not yet written (queued or in Spark)."""
        return self._inflight

    def submit(self, table: pa.Table, mark: Any = None) -> bool:
        """Queue a batch, blocking while the queue is full. Returns False only if the writer died."""
        with self._lock:
            self._inflight += 1
        while True:
            if not self._thread.is_alive():
                return False
            try:
                self._queue.put((table, mark), timeout=0.2)
                return True
            except queue.Full:
                continue

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
            raise WriteFailed(f"{self.lost_rows} rows could not be written to {self.root}")

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            table, mark = item
            try:
                if self.failed:
                    log.error("dropping a batch of %d rows behind a batch that could not be written", table.num_rows)
                    self.lost_rows += table.num_rows
                elif self._write(table):
                    self._on_committed(mark)
            finally:
                with self._lock:
                    self._inflight -= 1

    def _write(self, table: pa.Table) -> bool:
        attempt = 0
        backoff = 0.5
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                if self.spark is None:
                    self.spark = self._connect()
                write_batch(self.spark, table, self.root)
            except Exception as e:  # Spark reports server, network and data problems with many types
                self._on_failure(e)
                closing = self._closing.is_set() or self._stop.is_set()
                if closing and attempt >= self._final_attempts:
                    log.error("giving up on a batch of %d rows after %d attempts: %s", table.num_rows, attempt, e)
                    self.lost_rows += table.num_rows
                    self.failed = True
                    return False
                log.warning("writing %d rows to %s failed (attempt %d), retrying in %.1fs: %s",
                            table.num_rows, self.root, attempt, backoff, _first_line(e))
                # A restarted Connect server no longer knows our session: start a new one.
                self.spark = None
                time.sleep(backoff)
                backoff = min(backoff * 2, self._max_backoff)
                continue
            seconds = time.monotonic() - started
            self.written_rows += table.num_rows
            self._on_written(table.num_rows, seconds)
            return True


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
