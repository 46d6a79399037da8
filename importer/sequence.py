"""The receive stage's ordering: each device's messages in sequence, holes filled from its replay endpoint first.

No Spark here. `Ledger` remembers, per device, the position (journal, seq) handed to the
batch pipeline ("covered") and classifies each arriving message: the next one, a
duplicate (already covered), or one that leaves a hole. `Sequencer` acts on that: it drops
duplicates and fetches a hole from the device's replay endpoint, handing everything on in
order. Device 0 is not tracked (the number of an unconfigured device; several may exist).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping

import zmq

from importer.checkpoint import Position
from importer.metrics import ImporterMetrics
from logjam.errors import ProtocolError
from logjam.message import Message
from logjam.replay import Lost, ReplayClient, ReplayTimeout

log = logging.getLogger(__name__)

NEXT = 0
DUPLICATE = 1
HOLE = 2

# After a replay endpoint did not answer, gaps of that device are counted, not fetched, for this long.
REPLAY_RETRY_AFTER = 30.0


class Ledger:
    """Per device: the position handed to the pipeline (a batch or the filter)."""

    def __init__(self, resume: Mapping[int, Position] | None = None) -> None:
        self.covered: dict[int, Position] = dict(resume or {})
        self.duplicates: dict[int, int] = {}

    def classify(self, device: int, seq: int) -> int:
        """NEXT (hand it on), DUPLICATE (drop it), or HOLE (replay covered+1..seq-1 first).

        A device seen for the first time without a checkpoint starts at this message.
        """
        if device == 0:
            return NEXT
        covered = self.covered.get(device)
        if covered is None:
            self.covered[device] = Position(None, seq - 1)
            return NEXT
        if seq <= covered.seq:
            self.duplicates[device] = self.duplicates.get(device, 0) + 1
            return DUPLICATE
        return NEXT if seq == covered.seq + 1 else HOLE

    def seq(self, device: int) -> int:
        position = self.covered.get(device)
        return -1 if position is None else position.seq

    def cover(self, device: int, seq: int) -> None:
        position = self.covered.get(device)
        if device != 0 and (position is None or seq > position.seq):
            self.covered[device] = Position(position.journal if position else None, seq)

    def snapshot(self) -> dict[int, Position]:
        return dict(self.covered)


def replay_endpoint(sub_endpoint: str, port: int) -> str:
    """`tcp://host:9606` -> `tcp://host:<port>`: a device serves replay on the host it publishes from."""
    base, sep, _ = sub_endpoint.rpartition(":")
    if not sep or "://" not in base:
        raise ValueError(f"cannot derive a replay endpoint from {sub_endpoint!r}")
    return f"{base}:{port}"


class Sequencer:
    """Hands each device's messages on in sequence order, dropping duplicates and filling holes by replay."""

    def __init__(self, ledger: Ledger, metrics: ImporterMetrics, *, context: zmq.Context,
                 device_endpoint: Mapping[int, str], replay_port: int, replay_timeout: float,
                 stopping: Callable[[], bool]) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.ctx = context
        self.device_endpoint = device_endpoint
        self.replay_port = replay_port
        self.replay_timeout = replay_timeout
        self.stopping = stopping
        self.gap_total: dict[int, int] = {}
        self._clients: dict[int, ReplayClient] = {}
        self._down_until: dict[int, float] = {}

    def admit(self, msg: Message, handle: Callable[[Message], None]) -> bool:
        """Hand `msg` (and first whatever of its device it skipped) to `handle`; False for a duplicate."""
        meta = msg.meta
        device, seq = meta.device, meta.seq
        verdict = self.ledger.classify(device, seq)
        if verdict == DUPLICATE:
            self.metrics.duplicates.labels(self.metrics.worker, str(device)).inc()
            return False
        if verdict == HOLE:
            self.fill(device, self.ledger.seq(device) + 1, seq - 1, handle)
            if self.stopping():
                return False
        self.ledger.cover(device, seq)
        handle(msg)
        return True

    def _client(self, device: int) -> ReplayClient | None:
        client = self._clients.get(device)
        if client is None and time.monotonic() >= self._down_until.get(device, 0.0):
            endpoint = self.device_endpoint.get(device)
            if endpoint is not None:
                client = self._clients[device] = ReplayClient(replay_endpoint(endpoint, self.replay_port),
                                                              context=self.ctx, timeout=self.replay_timeout)
        return client

    def fill(self, device: int, first: int, last: int, handle: Callable[[Message], None]) -> None:
        """Fetch `first`..`last` of `device` from its replay endpoint and hand it on in order."""
        label = str(device)
        metrics = self.metrics
        client = self._client(device)
        replayed = 0
        try:
            if client is None:
                raise ReplayTimeout("replay is unavailable")
            for item in client.fetch(first, last):
                if isinstance(item, Lost):
                    metrics.lost_messages.labels(metrics.worker, label).inc(item.count)
                    log.error("device %d: seqs %d..%d are gone from its journal (retention): %d messages lost",
                              device, item.first, item.last, item.count)
                    self.ledger.cover(device, item.last)
                    continue
                seq = item.meta.seq
                if seq <= self.ledger.seq(device) or item.meta.device != device:
                    continue
                self.ledger.cover(device, seq)
                replayed += 1
                handle(item)
                if self.stopping():
                    return  # SIGTERM mid-replay: what was covered gets flushed; the rest comes next start
        except (ReplayTimeout, ProtocolError, ValueError) as e:
            # Without an answer there is nothing to wait for: count the rest as a gap and go on.
            self._clients.pop(device, None)
            if client is not None:
                client.close()
            self._down_until[device] = time.monotonic() + REPLAY_RETRY_AFTER
            log.warning("device %d: replay of %d..%d failed (%s); not asking again for %.0fs",
                        device, first, last, e, REPLAY_RETRY_AFTER)
        finally:
            metrics.replayed.labels(metrics.worker, label).inc(replayed)
        covered = self.ledger.seq(device)
        if covered < last:
            missing = last - covered
            metrics.gap_messages.labels(metrics.worker, label).inc(missing)
            self.gap_total[device] = self.gap_total.get(device, 0) + missing
            log.error("device %d: %d messages (%d..%d) could not be replayed and are lost", device, missing,
                      covered + 1, last)
            self.ledger.cover(device, last)
        else:
            metrics.recovered_gaps.labels(metrics.worker, label).inc()
            log.info("device %d: replayed %d messages (%d..%d)", device, replayed, first, last)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
