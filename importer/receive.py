"""The receive stage: every message the devices publish, in sequence order, into the batch or filtered out.

With the C decoder (importer/decode_native.py) the messages kept from a chunk are decoded
together, in one call, at the end of the chunk, or before a message that is handed on
alone (a replayed one), so rows keep the order of the sequence. A chunk already in sequence
(one device, each message the next) is also picked in C (`NativePicker`), from tables of
the app-envs and topics this receiver has decided about; a name it meets for the first time
goes through `_stream`/`_topic` here, which register the answer in C. The two ways are two
implementations of one method, `_columns` (`_columns_c`, `_columns_py`), chosen once when the
receiver is made, by the batch's builder.

A worker receives every stream (its gap tracking needs every sequence number) and keeps
only its own. Messages arrive as columns (`logjam.raw.RawBatch`, drained in C), so a
message of another worker's stream costs a few dictionary lookups and no object; only
heartbeats and replayed messages travel as `Message`s. Each message's (device, seq) goes
through the `Sequencer` (duplicates dropped, holes filled from replay first) or, without
recovery, through a gap tracker that only counts.
"""

from __future__ import annotations

import array
import logging
import time
from typing import Callable

from importer.batch import GroupCommit
from importer.decode import DUPLICATE_EVENT
from importer.decode_native import NativeBatchBuilder, NativePicker
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
        # A few streams, many messages: app-env bytes -> (name, kept by this worker, number);
        # topic bytes -> (name, number). Numbers are the C decoder's names (-1 without it).
        self._streams: dict[bytes, tuple[str, bool, int]] = {}
        self._topics: dict[bytes, tuple[str, int]] = {}
        self._journals: dict[str, int] = {}
        builder = batch.builder
        self._native = builder if isinstance(builder, NativeBatchBuilder) else None
        # The same caches of _streams and _topics in C, for chunks in sequence (None: picked here).
        self._picker = NativePicker(self._native) if self._native is not None else None
        # The chunk being received and its kept messages, 4 numbers each (importer/decode_native.py).
        self._pending: RawBatch | None = None
        self._picks = array.array("q")
        # One chunk's messages into the batch, chosen once here as the builder is: picked for the C
        # decoder, or added one by one for the Python one.
        self._columns: Callable[[RawBatch, Callable[[], bool]], None] = (
            self._columns_c if self._native is not None else self._columns_py)

    def receive(self, batches: list[RawBatch], stopping: Callable[[], bool]) -> None:
        self.ingested_us = time.time_ns() // 1000
        for raw in batches:
            self._columns(raw, stopping)
            if stopping():
                break

    def _stream(self, app_env: bytes) -> tuple[str, bool, int]:
        """(name, kept by this worker, its number for the C decoder or -1)."""
        entry = self._streams.get(app_env)
        if entry is None:
            name = app_env.decode("utf-8", "replace")
            keeps = self.filter.keeps(name)
            entry = (name, keeps, self._native.name_id(name) if keeps and self._native is not None else -1)
            if len(self._streams) < 100_000:
                self._streams[app_env] = entry
                if self._picker is not None:
                    self._picker.stream(app_env, *entry)
        return entry

    def _topic(self, topic_b: bytes) -> tuple[str, int]:
        entry = self._topics.get(topic_b)
        if entry is None:
            name = topic_b.decode("utf-8", "replace")
            entry = (name, self._native.name_id(name) if self._native is not None else -1)
            if len(self._topics) < 100_000:
                self._topics[topic_b] = entry
                if self._picker is not None:
                    self._picker.topic(topic_b, entry[1])
        return entry

    def _journal_id(self, journal: str | None) -> int:
        if journal is None or self._native is None:
            return -1
        n = self._journals.get(journal)
        if n is None:
            n = self._journals[journal] = self._native.name_id(journal)
        return n

    def _columns_py(self, raw: RawBatch, stopping: Callable[[], bool]) -> None:
        """`_columns` of the Python decoder: each kept message added to the batch here, one by one."""
        data, pos, meta = raw.data, raw.pos, raw.meta
        endpoints, tally, sequencer = self.device_endpoint, self.tally, self.sequencer
        check = sequencer.check if sequencer is not None else None
        journal_of = sequencer.ledger.journal if sequencer is not None else None
        streams, topics, add_raw = self._streams, self._topics, self.batch.add_raw
        # A chunk of one device's messages, each the next, without a heartbeat: sequenced at once, not
        # message by message. The chunk's bytes are searched for the heartbeat's app-env (a body holding
        # those bytes then just takes the long way).
        ordered = sequencer is not None and _HEARTBEAT not in data and sequencer.take_in_order(meta, raw.n)
        for i in range(raw.n):
            p, m = 6 * i, 4 * i
            at = pos[p]
            app_env = data[at : at + pos[p + 1]]
            device, seq = meta[m + 1], meta[m + 3]
            if device not in endpoints:
                endpoints[device] = raw.endpoint
            if app_env == _HEARTBEAT:
                self._heartbeat(raw, i)
                continue
            if ordered:
                pass
            elif check is not None:
                if not check(device, seq, self.handle):
                    if stopping():
                        return
                    continue
            else:
                gap = self.tracker.observe(device, seq)  # type: ignore[union-attr]
                if gap is not None:
                    self.gaps.gap(gap)
            tally.received += 1
            name, keeps, _ = streams.get(app_env) or self._stream(app_env)
            if not keeps:
                tally.skipped += 1
                continue
            at = pos[p + 2]
            topic_b = data[at : at + pos[p + 3]]
            topic = (topics.get(topic_b) or self._topic(topic_b))[0]
            at = pos[p + 4]
            error = add_raw(name, topic, data[at : at + pos[p + 5]], meta[m], device, meta[m + 2], seq,
                            self.ingested_us, journal_of(device) if journal_of is not None else None)
            self._count(name, error, seq)

    def _columns_c(self, raw: RawBatch, stopping: Callable[[], bool]) -> None:
        """`_columns` of the C decoder: the kept messages picked (4 numbers each), decoded together
        in one call at the end of the chunk, or before a message that is handed on alone."""
        native = self._native
        assert native is not None
        if native.tidy_names():  # the numbers cached here are void
            self._streams.clear()
            self._topics.clear()
            self._journals.clear()
            if self._picker is not None:
                self._picker.clear()
        self._pending = raw
        try:
            data, pos, meta = raw.data, raw.pos, raw.meta
            endpoints, tally, sequencer = self.device_endpoint, self.tally, self.sequencer
            # A chunk of one device's messages, each the next, without a heartbeat: sequenced at once, not
            # message by message. C compares the app-env frames with the heartbeat's; without the picker
            # the chunk's bytes are searched (a body holding those bytes then just takes the long way).
            picker = self._picker
            heartbeat = picker.holds(raw, _HEARTBEAT) if picker is not None else _HEARTBEAT in data
            if sequencer is not None and not heartbeat and sequencer.take_in_order(meta, raw.n):
                self._pick_ordered(raw)
                return
            check = sequencer.check if sequencer is not None else None
            journal_of = sequencer.ledger.journal if sequencer is not None else None
            picks, rows, streams, topics = self._picks, tally.rows, self._streams, self._topics
            journal: str | None = None
            journal_n = -1
            for i in range(raw.n):
                p, m = 6 * i, 4 * i
                at = pos[p]
                app_env = data[at : at + pos[p + 1]]
                device, seq = meta[m + 1], meta[m + 3]
                if device not in endpoints:
                    endpoints[device] = raw.endpoint
                if app_env == _HEARTBEAT:
                    self._heartbeat(raw, i)
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
                name, keeps, stream = streams.get(app_env) or self._stream(app_env)
                if not keeps:
                    tally.skipped += 1
                    continue
                at = pos[p + 2]
                topic_b = data[at : at + pos[p + 3]]
                topic_n = (topics.get(topic_b) or self._topic(topic_b))[1]
                if journal_of is not None:
                    got = journal_of(device)
                    if got is not journal:
                        journal, journal_n = got, self._journal_id(got)
                picks.extend((i, stream, topic_n, journal_n))
                rows[name] = rows.get(name, 0) + 1
        finally:
            self._flush()
            self._pending = None

    def _heartbeat(self, raw: RawBatch, i: int) -> None:
        """Message `i` of `raw`, a heartbeat: as a Message through the sequencer (it covers its seq), or counted."""
        meta, m = raw.meta, 4 * i
        msg = Message(HEARTBEAT, raw.frame(i, 1).decode("utf-8", "replace"), raw.frame(i, 2),
                      Meta(meta[m], meta[m + 1], meta[m + 2], meta[m + 3]))
        if self.sequencer is not None:
            self.sequencer.admit(msg, self.handle)
        else:
            self.tally.received += 1

    def _pick_ordered(self, raw: RawBatch) -> None:
        """The C path's picks for a chunk already sequenced (`take_in_order`): one device, one journal."""
        data, pos, n = raw.data, raw.pos, raw.n
        device = raw.meta[1]
        self.device_endpoint.setdefault(device, raw.endpoint)
        assert self.sequencer is not None
        journal_n = self._journal_id(self.sequencer.ledger.journal(device))
        tally = self.tally
        tally.received += n
        picks, rows, streams, topics, picker = self._picks, tally.rows, self._streams, self._topics, self._picker
        skipped = i = 0
        while i < n:
            if picker is not None:
                # C picks until a name it has no answer for; that message is picked below, which registers it.
                i, more = picker.run(raw, i, journal_n, picks, rows)
                skipped += more
                if i == n:
                    break
            p = 6 * i
            at = pos[p]
            app_env = data[at : at + pos[p + 1]]
            name, keeps, stream = streams.get(app_env) or self._stream(app_env)
            if not keeps:
                skipped += 1
            else:
                at = pos[p + 2]
                topic_b = data[at : at + pos[p + 3]]
                picks.extend((i, stream, (topics.get(topic_b) or self._topic(topic_b))[1], journal_n))
                rows[name] = rows.get(name, 0) + 1
            i += 1
        tally.skipped += skipped

    def _flush(self) -> None:
        """Decode the picks of the chunk being received (C), then count what did not become a plain row."""
        raw, picks = self._pending, self._picks
        if raw is None or not picks:
            return
        results = self.batch.add_picks(raw, picks, self.ingested_us)
        for k, result in results:
            i = picks[4 * k]
            name = self._stream(raw.frame(i, 0))[0]
            self.tally.rows[name] -= 1  # counted as a row when picked
            self._count(name, result, raw.meta[4 * i + 3])
        del picks[:]

    def handle(self, msg: Message, journal: str | None = None) -> None:
        """One message that travels as a Message (a heartbeat, a replayed one), in sequence order."""
        self._flush()  # what was picked before it goes first
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
