"""The receive stage's ordering: each device's messages in sequence, holes filled from its replay endpoint first.

No Spark here. `Ledger` remembers, per device, the position (journal, seq) handed to the
batch pipeline ("covered") and classifies each arriving message: the next one, a
duplicate (already covered), or one that leaves a hole. `Sequencer` acts on that: it drops
duplicates and fetches a hole from the device's replay endpoint, handing everything on in
order. Device 0 is not tracked (the number of an unconfigured device; several may exist).

Sequence numbers only mean something within one journal: a device whose journal was
wiped or replaced starts again at 1. Devices announce their journal's id in every
heartbeat (`{"journal": id, "first": oldest seq held}`) and in every replay answer, so a
change of id is seen as such: it is logged, counted, and the new journal is read from its
first seq, never taken for duplicates. A seq that goes backwards without a heartbeat in
between (one dropped by the high-water mark) makes the sequencer ask the replay endpoint
which journal it serves before it drops anything. Two live devices with one id show up
as a journal id that flips back and forth; that is reported loudly and not followed.
"""

from __future__ import annotations

import array

import logging
import time
from typing import Any, Callable, Mapping, NamedTuple

import orjson
import zmq

from importer.metrics import ImporterMetrics
from logjam.errors import ProtocolError
from logjam.message import Message
from logjam import endpoints
from logjam.curve import ClientKey
from logjam.replay import JournalChanged, Lost, ReplayClient, ReplayTimeout

log = logging.getLogger(__name__)

NEXT = 0
DUPLICATE = 1
HOLE = 2

# After a replay endpoint did not answer, gaps of that device are counted, not fetched, for this long.
REPLAY_RETRY_AFTER = 30.0
# A seq going backwards is checked against the replay endpoint's journal id at most this often per device.
JOURNAL_CHECK_INTERVAL = 5.0
# A journal id that comes back within this long after it was replaced means two devices share one id.
FLAP_WINDOW = 120.0

Handle = Callable[[Message, "str | None"], None]
# The highest seq of (device, journal) the table holds (its app transaction), or None.
Landed = Callable[[int, str], "int | None"]


class Position(NamedTuple):
    """Where a device's stream stands: its journal's id (None: unknown or none) and a sequence number."""

    journal: str | None
    seq: int


class Ledger:
    """Per device: the position handed to the pipeline (a batch or the filter)."""

    def __init__(self, resume: Mapping[int, Position] | None = None) -> None:
        self.covered: dict[int, Position] = dict(resume or {})
        self.duplicates: dict[int, int] = {}

    def classify(self, device: int, seq: int) -> int:
        """NEXT (hand it on), DUPLICATE (drop it), or HOLE (replay covered+1..seq-1 first).

        A device seen for the first time without a position starts at this message (the
        `Sequencer` first places it at the start of the device's journal when it can).
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

    def journal(self, device: int) -> str | None:
        position = self.covered.get(device)
        return None if position is None else position.journal

    def reset(self, device: int, position: Position) -> None:
        """Start `device` over at `position` (a new journal)."""
        self.covered[device] = position

    def cover(self, device: int, seq: int) -> None:
        position = self.covered.get(device)
        if device != 0 and (position is None or seq > position.seq):
            self.covered[device] = Position(position.journal if position else None, seq)

    def snapshot(self) -> dict[int, Position]:
        return dict(self.covered)


def replay_endpoint(sub_endpoint: str, port: int) -> str:
    """`tcp://host:9606` -> `tcp://host:<port>`: a device serves replay on the host it publishes from;
    `ipc://DIR/pub` -> `ipc://DIR/replay`, beside it (`port` does not apply)."""
    if endpoints.is_local(sub_endpoint):
        return endpoints.sibling(sub_endpoint, "replay")
    base, sep, _ = sub_endpoint.rpartition(":")
    if not sep or "://" not in base:
        raise ValueError(f"cannot derive a replay endpoint from {sub_endpoint!r}")
    return f"{base}:{port}"


class Sequencer:
    """Hands each device's messages on in sequence order, dropping duplicates and filling holes by replay."""

    def __init__(self, ledger: Ledger, metrics: ImporterMetrics, *, context: zmq.Context,
                 device_endpoint: Mapping[int, str], replay_port: int, replay_timeout: float,
                 stopping: Callable[[], bool], curve: ClientKey | None = None,
                 replay_ports: Mapping[str, int] | None = None,
                 between: Callable[[], None] | None = None, landed: Landed | None = None) -> None:
        self.ledger = ledger
        # Where the table says a journal stands: a device met for the first time resumes after it.
        self.landed: Landed = landed or (lambda device, journal: None)
        # Called between two replayed messages: the worker commits a long replay in pieces, so
        # that an importer killed every half minute still gets through a replay of many minutes.
        self.between = between
        self.curve = curve
        self.metrics = metrics
        self.ctx = context
        self.device_endpoint = device_endpoint
        self.replay_port = replay_port
        # Devices on one host each serve replay on their own port: SUB endpoint -> that port.
        self.replay_ports = dict(replay_ports or {})
        self.replay_timeout = replay_timeout
        self.stopping = stopping
        self.gap_total: dict[int, int] = {}
        self._clients: dict[int, ReplayClient] = {}
        self._down_until: dict[int, float] = {}
        self._confirmed: dict[int, float] = {}  # when a device's journal id was last confirmed
        self._journals: dict[int, dict[str, float]] = {}  # journals a device left, and when
        self._flap_logged: dict[int, float] = {}

    def admit(self, msg: Message, handle: Handle) -> bool:
        """Hand `msg` (and first whatever of its device it skipped) to `handle`; False for a duplicate."""
        meta = msg.meta
        device, seq = meta.device, meta.seq
        if device and msg.is_heartbeat:
            self._announced(device, seq, msg.body)
        if not self.check(device, seq, handle):
            return False
        handle(msg, self.ledger.journal(device))
        return True

    def take_in_order(self, meta: Any, n: int) -> bool:
        """Whether a chunk of `n` messages (meta: 4 ints each, as in `RawBatch`) is all one known device's,
        each exactly the next: the common case, covered here at once so that no message of it needs
        `check`. Anything else (a hole, a duplicate, a new device, another device) says False and is
        checked message by message. The caller makes sure no heartbeat is among them."""
        if n == 0 or self.stopping():
            return False
        devices = meta[1::4]
        device = devices[0]
        position = self.ledger.covered.get(device)
        if device == 0 or position is None or devices.count(device) != n:
            return False
        first = position.seq + 1
        seqs = meta[3::4]
        if seqs[0] != first or seqs[n - 1] != first + n - 1:
            return False
        expected = range(first, first + n)
        if not (seqs == array.array(seqs.typecode, expected) if isinstance(seqs, array.array)
                else seqs == list(expected)):
            return False
        self.ledger.cover(device, first + n - 1)
        return True

    def check(self, device: int, seq: int, handle: Handle) -> bool:
        """Whether message (device, seq) comes next, after handing on whatever of its device it skipped
        (fetched from replay); False for a duplicate (or when stopping). The caller then hands it on."""
        if device and device not in self.ledger.covered:
            self._start_at_journal(device, seq)
        for _ in range(2):  # a second round only after a journal change found while filling
            verdict = self.ledger.classify(device, seq)
            if verdict == DUPLICATE and self._journal_replaced(device):
                verdict = self.ledger.classify(device, seq)
            if verdict == DUPLICATE:
                self.metrics.duplicates.labels(self.metrics.worker, str(device)).inc()
                return False
            if verdict == HOLE and not self.fill(device, self.ledger.seq(device) + 1, seq - 1, handle):
                continue
            break
        if self.stopping():
            return False
        self.ledger.cover(device, seq)
        return True

    def _start_at_journal(self, device: int, seq: int) -> None:
        """A device met for the first time: resume after what the table holds of its journal, else read it
        from the oldest seq its journal holds.

        Starting at the first message received instead would skip everything the device accepted
        before this importer subscribed (the 10-20 s a mesh takes to start, or a device this
        importer just took over), and nothing would count it as a gap.
        """
        client = self._client(device)
        try:
            if client is None:
                raise ReplayTimeout("replay is unavailable")
            info = client.info()
        except (ReplayTimeout, ProtocolError) as e:
            log.warning("device %d: no position and no journal info (%s); starting at seq %d, what it accepted "
                        "before is not landed", device, e, seq)
            return
        if self._resume(device, info.journal_id):
            return
        first = min(info.first, seq)
        self.ledger.reset(device, Position(info.journal_id, first - 1))
        log.info("device %d: journal %s has nothing in the table; reading it from seq %d "
                 "(its oldest; %d messages before seq %d)", device, info.journal_id, first, seq - first, seq)

    def _resume(self, device: int, journal: str) -> bool:
        """Place `device` after what the table holds of `journal`; False when it holds nothing."""
        held = self.landed(device, journal)
        if held is None:
            return False
        self.ledger.reset(device, Position(journal, held))
        log.info("device %d: resuming journal %s after seq %d (the table's app transaction)", device, journal, held)
        return True

    # -- journal identity -------------------------------------------------------------------------
    def _announced(self, device: int, seq: int, body: bytes) -> None:
        """A heartbeat: follow its journal id."""
        try:
            doc = orjson.loads(body)
            journal, first = doc["journal"], int(doc["first"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            return  # a device from before journal ids
        if not isinstance(journal, str):
            return
        self._confirmed[device] = time.monotonic()
        position = self.ledger.covered.get(device)
        if position is None:
            if self._resume(device, journal):
                return
            # Nothing landed from this journal yet: everything it still holds is ours to land.
            self.ledger.reset(device, Position(journal, min(first, seq) - 1))
            log.info("device %d: journal %s has nothing in the table; reading it from seq %d (its oldest)",
                     device, journal, min(first, seq))
        elif position.journal is None:
            # Started without its journal's id (replay did not answer): the same journal, unless its numbers went back.
            self.ledger.reset(device, Position(journal, position.seq) if seq > position.seq
                              else Position(journal, first - 1))
            log.info("device %d announces journal %s", device, journal)
        elif position.journal != journal:
            self._switch(device, journal, first, "its heartbeat")

    def _journal_replaced(self, device: int) -> bool:
        """On a seq that went backwards: whether the device now serves another journal (then switched to it)."""
        journal = self.ledger.journal(device)
        now = time.monotonic()
        if journal is None or now - self._confirmed.get(device, 0.0) < JOURNAL_CHECK_INTERVAL:
            return False
        self._confirmed[device] = now
        client = self._client(device)
        if client is None:
            return False
        try:
            info = client.info()
        except (ReplayTimeout, ProtocolError) as e:
            log.debug("device %d: cannot ask for its journal id: %s", device, e)
            return False
        if info.journal_id == journal:
            return False
        return self._switch(device, info.journal_id, info.first, "its replay endpoint")

    def _switch(self, device: int, journal: str, first: int, source: str) -> bool:
        """Read `device` from `journal`'s first seq on; False when that would flip back to a recent journal."""
        now = time.monotonic()
        old = self.ledger.journal(device)
        seen = self._journals.setdefault(device, {})
        if old is not None:
            seen[old] = now
        if now - seen.get(journal, -FLAP_WINDOW) < FLAP_WINDOW:
            self.metrics.duplicate_device_ids.labels(self.metrics.worker, str(device)).inc()
            if now >= self._flap_logged.get(device, 0.0):
                self._flap_logged[device] = now + 30.0
                log.error("device id %d is used by two live devices (journals %s and %s): their sequence numbers "
                          "mix and cannot be tracked; give every device its own -d", device, old, journal)
            return False
        self.metrics.journal_changes.labels(self.metrics.worker, str(device)).inc()
        log.warning("device %d serves a new journal %s (was %s, seen through %s); reading it from seq %d",
                    device, journal, old, source, first)
        held = self.landed(device, journal)
        self.ledger.reset(device, Position(journal, max(first - 1, held if held is not None else -1)))
        return True

    def _client(self, device: int) -> ReplayClient | None:
        client = self._clients.get(device)
        if client is None and time.monotonic() >= self._down_until.get(device, 0.0):
            endpoint = self.device_endpoint.get(device)
            if endpoint is not None:
                port = self.replay_ports.get(endpoint, self.replay_port)
                client = self._clients[device] = ReplayClient(replay_endpoint(endpoint, port),
                                                              context=self.ctx, timeout=self.replay_timeout,
                                                              curve=self.curve)
        return client

    def fill(self, device: int, first: int, last: int, handle: Handle) -> bool:
        """Fetch `first`..`last` of `device` from its replay endpoint and hand it on in order.

        False when the endpoint serves another journal: the ledger then starts over in it,
        and the caller classifies its message again.
        """
        label = str(device)
        metrics = self.metrics
        client = self._client(device)
        journal = self.ledger.journal(device)
        replayed = 0
        try:
            if client is None:
                raise ReplayTimeout("replay is unavailable")
            for item in client.fetch(first, last, journal=journal):
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
                handle(item, journal)
                if self.between is not None:
                    self.between()
                if self.stopping():
                    return True  # SIGTERM mid-replay: what was covered gets flushed; the rest comes next start
        except JournalChanged as e:
            if self._switch(device, e.actual, e.first, "its replay endpoint"):
                return False
            # A flapping id (two devices): what could not be fetched is counted as a gap below.
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
        return True

    def report(self, committed: Mapping[int, Position], name: str) -> None:
        """Tell each device how far this importer has committed (its flow control waits for slow importers)."""
        for device, position in committed.items():
            if device == 0 or position.journal is None:
                continue
            client = self._client(device)
            if client is not None:
                try:
                    client.progress(position.journal, position.seq, name)
                except zmq.Again:
                    pass  # not connected yet: the next report will do

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
