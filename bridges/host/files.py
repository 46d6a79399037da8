"""What the bridges that store what they accept (segment, rustlog) share: the store's id and its health.

The durable-file primitives themselves (whole writes, directory fsyncs, atomic
replacement) are runtime/durable.py's, and the logs run on runtime/seglog.py.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from prometheus_client import Counter, Gauge

from bridges.host.metrics import BridgeMetrics
from runtime.durable import replace_file

# A store write that failed (a full disk) is tried again about this often.
RETRY_EVERY = 1.0


def store_id(root: Path) -> str:
    """The random id of the store under `root`, made once and kept in `root/store-id`.

    Idempotency keys of stored events are `<store-id>:<position>`: stable across
    restarts of the bridge, and distinct between two bridges with their own stores.
    """
    path = root / "store-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    replace_file(path, os.urandom(8).hex() + "\n")
    return path.read_text().strip()


class StoreHealth:
    """Whether a bridge's store takes writes: one log line when that changes, and two metrics.

    `logjam_bridge_store_writable{protocol}` is 1 or 0, and
    `logjam_bridge_store_write_failures_total{protocol}` counts every failed write or fsync,
    so that a full disk shows without a log line per attempt.
    """

    def __init__(self, log: logging.Logger, metrics: BridgeMetrics, what: str) -> None:
        self.log = log
        self.what = what
        self.writable = True
        self.failures = 0
        self._since = 0.0
        self._failures_then = 0
        registry, protocol = metrics.registry, metrics.protocol
        Gauge("logjam_bridge_store_writable", "1 while store writes succeed, 0 while they fail (a full disk)",
              ["protocol"], registry=registry).labels(protocol).set_function(lambda: int(self.writable))
        self._failed = Counter("logjam_bridge_store_write_failures", "Store writes and fsyncs that failed",
                               ["protocol"], registry=registry).labels(protocol)

    def failed(self, error: BaseException, doing: str) -> None:
        """A write failed; `doing` says what waits for it (e.g. "holding appends until it can write")."""
        self.failures += 1
        self._failed.inc()
        if self.writable:
            self.writable = False
            self._since = time.monotonic()
            self._failures_then = self.failures - 1
            self.log.error("%s write failed: %s; %s", self.what, error, doing)
        else:
            self.log.debug("%s write failed again: %s", self.what, error)

    def succeeded(self) -> None:
        if not self.writable:
            self.writable = True
            self.log.info("%s writable again after %.1f s (%d failed attempts)", self.what,
                          time.monotonic() - self._since, self.failures - self._failures_then)
