"""The receive stage: every message the devices publish, in sequence order, into the batch or filtered out.

A worker receives every stream (its gap tracking needs every sequence number) and keeps
only its own. Messages arrive as columns (`logjam.raw.RawBatch`, drained in C), so a
message of another worker's stream costs a few dictionary lookups and no object; only
heartbeats and replayed messages travel as `Message`s. Each message's (device, seq) goes
through the `Sequencer` (duplicates dropped, holes filled from replay first) or, without
recovery, through a gap tracker that only counts.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from importer.batch import GroupCommit
from importer.decode import DUPLICATE_EVENT
from importer.report import GapReport, Tally
from importer.sequence import Sequencer
from importer.split import StreamFilter
from logjam.message import HEARTBEAT, Message
from logjam.meta import Meta
from logjam.raw import RawBatch
from logjam.subscriber import GapTracker

log = logging.getLogger("logjam-importer")

_HEARTBEAT = HEARTBEAT.encode()


class Receiver:
    def __init__(self, batch: GroupCommit, stream_filter: StreamFilter, tally: Tally, gaps: GapReport,
                 sequencer: Sequencer | None, device_endpoint: dict[int, str]) -> None:
        self.batch = batch
        self.filter = stream_filter
        self.tally = tally
        self.gaps = gaps
        self.sequencer = sequencer
        self.tracker = GapTracker() if sequencer is None else None
        self.device_endpoint = device_endpoint
        self.ingested_us = 0
        # A few streams, many messages: app-env bytes -> (name, kept by this worker); topic bytes -> name.
        self._streams: dict[bytes, tuple[str, bool]] = {}
        self._topics: dict[bytes, str] = {}

    def receive(self, batches: list[RawBatch], stopping: Callable[[], bool]) -> None:
        self.ingested_us = time.time_ns() // 1000
        for raw in batches:
            self._columns(raw, stopping)
            if stopping():
                break

    def _stream(self, app_env: bytes) -> tuple[str, bool]:
        entry = self._streams.get(app_env)
        if entry is None:
            name = app_env.decode("utf-8", "replace")
            entry = (name, self.filter.keeps(name))
            if len(self._streams) < 100_000:
                self._streams[app_env] = entry
        return entry

    def _columns(self, raw: RawBatch, stopping: Callable[[], bool]) -> None:
        data, pos, meta = raw.data, raw.pos, raw.meta
        endpoints, tally, sequencer = self.device_endpoint, self.tally, self.sequencer
        check = sequencer.check if sequencer is not None else None
        for i in range(raw.n):
            p, m = 6 * i, 4 * i
            at = pos[p]
            app_env = data[at : at + pos[p + 1]]
            device, seq = meta[m + 1], meta[m + 3]
            if device not in endpoints:
                endpoints[device] = raw.endpoint
            if app_env == _HEARTBEAT:
                msg = Message(HEARTBEAT, raw.frame(i, 1).decode("utf-8", "replace"), raw.frame(i, 2),
                              Meta(meta[m], device, meta[m + 2], seq))
                if sequencer is not None:
                    sequencer.admit(msg, self.handle)
                else:
                    tally.received += 1
                continue
            if check is not None:
                if not check(device, seq, self.handle):
                    if stopping():
                        return
                    continue
            else:
                gap = self.tracker.observe(device, seq)  # type: ignore[union-attr]
                if gap is not None:
                    self.gaps.gap(gap)
            tally.received += 1
            name, keeps = self._stream(app_env)
            if not keeps:
                tally.skipped += 1
                continue
            at = pos[p + 2]
            topic_b = data[at : at + pos[p + 3]]
            topic = self._topics.get(topic_b)
            if topic is None:
                topic = self._topics[topic_b] = topic_b.decode("utf-8", "replace")
            at = pos[p + 4]
            journal = sequencer.ledger.journal(device) if sequencer is not None else None
            error = self.batch.add_raw(name, topic, data[at : at + pos[p + 5]], meta[m], device, meta[m + 2], seq,
                                       self.ingested_us, journal)
            self._count(name, error, seq)

    def handle(self, msg: Message, journal: str | None = None) -> None:
        """One message that travels as a Message (a heartbeat, a replayed one), in sequence order."""
        tally = self.tally
        tally.received += 1
        if msg.is_heartbeat:
            return
        app_env = msg.app_env
        if not self.filter.keeps(app_env):
            tally.skipped += 1
            return
        self._count(app_env, self.batch.add(msg, self.ingested_us, journal), msg.meta.seq)

    def _count(self, app_env: str, error: str | None, seq: int) -> None:
        tally = self.tally
        if error is DUPLICATE_EVENT:
            # Like a filtered-out message: its seq is covered, no row is written.
            tally.duplicate_events[app_env] = tally.duplicate_events.get(app_env, 0) + 1
            self.gaps.duplicate_events += 1
            return
        tally.rows[app_env] = tally.rows.get(app_env, 0) + 1
        if error is not None:
            tally.errors[app_env] = tally.errors.get(app_env, 0) + 1
            log.debug("%s seq %d: %s", app_env, seq, error)
