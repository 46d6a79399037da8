"""The write stage: batches become commits, written in a thread of their own, in order, retried until they land.

- the commit (importer/commit.py): one batch with its rows and the positions it covers, one
  Delta commit with its app transactions; `run()` is idempotent;
- the retry thread (here): `BackgroundWriter` runs the commits in order while the main thread
  decodes the next batch, and only retries them.

A failed attempt is retried with backoff; the commit finds out itself, from the table's
transactions, what of it had landed. After every few failed attempts the writer looks for
the rows that fail by themselves while the others would succeed; those go to the quarantine
partition and the rest lands. A failure of everything (disk full, the store unreachable) is
waited out. A write that runs longer than `--write-timeout` is reported as stalled. After a
batch has been given up (failed writes at shutdown) later batches are dropped too, so that
the table is always a prefix of what was submitted.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import pyarrow as pa

from importer.batch import Batch
from importer.commit import Commit, TableTarget
from importer.failures import describe
from table.paths import QUARANTINE

log = logging.getLogger(__name__)


class WriteFailed(RuntimeError):
    """A batch could not be written before shutdown; its rows are lost to this run."""


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
        target: TableTarget,
        *,
        listener: WriteListener | None = None,
        stop: threading.Event | None = None,
        max_backoff: float = 10.0,
        final_attempts: int = 3,
        quarantine_after: int = 4,
    ) -> None:
        self.target = target
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
        self.lost_rows = 0
        self.written_rows = 0
        self._inflight = 0
        self.started: float | None = None  # monotonic start of the commit under way
        self._lock = threading.Lock()
        self.done = threading.Event()  # set whenever a batch finishes (the main loop waits on it)
        self._thread = threading.Thread(target=self._run, name="table-writer", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Batches submitted and not yet written (queued or being committed)."""
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
            raise WriteFailed(f"{self.lost_rows} rows could not be written to {self.target.location}")

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
                self.started = started
                if commit is None:
                    commit = Commit(self.target, batch.table, batch.mark)
                commit.run()
            except Exception as e:  # delta-rs reports storage, conflict and data problems with many types
                self.started = None
                self._failed(e)
                closing = self._closing.is_set() or self._stop.is_set()
                if closing and attempt >= self._final_attempts:
                    log.error("giving up on a batch of %d rows after %d attempts: %s", batch.rows, attempt, describe(e))
                    self.lost_rows += batch.rows
                    self.failed = True
                    return False
                log.warning("writing %d rows to %s failed (attempt %d), retrying in %.1fs: %s",
                            batch.rows, self.target.location, attempt, backoff, self.last_error)
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
            bad = self.target.isolate(rows)
        except Exception as e:  # the probe itself fails: nothing to single out
            log.debug("could not look for failing partitions: %s", describe(e))
            return known
        if bad - known:
            log.error("quarantining the rows of %d stream(s) whose writes keep failing while others succeed "
                      "(%s); they land in app_env='%s' with their name in original_app_env",
                      len(bad), ", ".join(f"{a}/{d}" for a, d in sorted(bad)[:5]), QUARANTINE)
        return known | bad
