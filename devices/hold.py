"""What the device does while its journal cannot be written (a full disk, a file-size limit, EIO).

A batch whose journal write failed was neither published nor acknowledged, and the
journal was cut back to its last whole batch. The device keeps that batch (`Held`),
stops reading its input sockets, so that clients and bridges see a slow device and
back-pressure does the rest, and tries the same write again about once a second.
When it succeeds the batch is published and answered, and the device reads again.

`JournalHealth` is the state the operator sees: one log line when writes start
failing, one when they work again, and numbers for metrics and the stats socket.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

log = logging.getLogger("logjam-device")

RETRY_EVERY = 1.0


@dataclass(slots=True)
class Held:
    """A numbered batch the journal could not take, and what to do once it is published."""

    batch: Any  # a TupleBatch or NativeBatch, already numbered
    first: int
    count: int
    then: Callable[[], None] | None


class JournalHealth:
    """Writable or not; every failed attempt counted; a log line only when that changes."""

    def __init__(self) -> None:
        self.writable = True
        self.failures = 0
        self.held = 0  # messages waiting for the journal
        self.next_retry = 0.0
        self._since = 0.0
        self._failures_then = 0

    def failed(self, error: OSError, held: int = 0) -> None:
        now = time.monotonic()
        self.failures += 1
        self.held = held
        self.next_retry = now + RETRY_EVERY
        if self.writable:
            self.writable = False
            self._since = now
            self._failures_then = self.failures - 1
            log.error("journal write failed: %s; not accepting until it can write", error)
        else:
            log.debug("journal write failed again: %s", error)

    def recovered(self) -> None:
        self.held = 0
        if not self.writable:
            self.writable = True
            log.info(
                "journal writable again after %.1f s (%d failed attempts); accepting",
                time.monotonic() - self._since, self.failures - self._failures_then,
            )

    def due(self, now: float) -> bool:
        return now >= self.next_retry

    def stats(self) -> dict[str, Any]:
        return {"journal_writable": self.writable, "journal_write_failures": self.failures, "held_messages": self.held}
