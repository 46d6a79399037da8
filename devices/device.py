"""The device proper: ROUTER + PULL in, PUB out, renumbering every message it publishes.

Throughput decides the shape of this module. ZeroMQ's own cost per message is fixed;
what we control is the Python work per message, so:

- input is drained in batches with NOBLOCK and the poller is only consulted when both
  input sockets are empty;
- frames are received as `zmq.Frame` objects because a Frame carries its RCVMORE
  flag, whereas asking the socket for RCVMORE costs more than the receive itself;
- socket methods are the backend's unbound C methods, skipping pyzmq's Python
  wrappers (`send_multipart` alone costs more than the rest of the loop);
- checks are cache lookups on raw bytes (valid stream names and topics are
  remembered), and the only new object per message is the 24-byte meta.

Where it was built, both input sockets instead take the C fast path in
`devices.native`, which holds a whole batch as zmq_msg_t's and never makes a Python
object per message; the Python loop below is the fallback (LOGJAM_NATIVE=off, no
build, and always with --compress).

Everything accepted goes through `_commit`, the one place where messages are
numbered, journaled (with --data-dir) and published, in that order. Replies to
requests are sent after `_commit`, so a 202 is never ahead of the journal or the
publish. When the journal cannot be written, `_commit` holds the batch and the loop
stops reading until a retry succeeds (devices/hold.py). The replay endpoint runs in
its own thread (devices/replay.py).

Subscribers learn the journal id from heartbeats: one is published at start, and
PUB is an XPUB in manual mode, so that a new subscription takes effect only here,
followed at once by a heartbeat: the first message a new subscriber gets is one.
"""

from __future__ import annotations

import json
import logging
import socket as pysocket
import threading
import time
from typing import Callable

import zmq
from zmq.backend import Socket as _RawSocket

from logjam import sockets
from logjam.compression import compress
from logjam.meta import META_COMPRESSION_AT, META_HEAD, META_SIZE, now_ms
from devices import stamp
from devices import native
from devices.batch import TupleBatch
from devices.config import DeviceConfig
from devices.counters import NAME_CACHE, Counters
from devices.hold import Held, JournalHealth
from devices.journal import Journal, JournalWriteError, new_journal_id
from devices.native import NativeBatch
from devices.lag import ImporterLag
from devices.replay import ReplayServer
from devices.stamp import FRESH_META, HEADS
from runtime.curve import Gatekeeper

__all__ = ["Device", "DeviceConfig", "TupleBatch"]

log = logging.getLogger("logjam-device")

ACCEPTED = b"202 Accepted"
BAD_REQUEST = b"400 Bad Request"
PONG = b"200 OK"
PING = b"ping"
HEARTBEAT = b"heartbeat"
STATS = b"stats"

# Messages taken from one socket before the other gets its turn (and before timers
# are looked at); big enough to amortise the loop, small enough to stay fair.
BATCH = 1000
# New subscriptions are taken (each batch of them followed by a heartbeat) at most this often.
WELCOME_EVERY = 0.05

_NB = zmq.NOBLOCK
_SM = zmq.SNDMORE
_recv = _RawSocket.recv
_send = _RawSocket.send
_Again = zmq.Again


class Device(Counters):
    """Owns the sockets and counters; `run()` serves until `stop` is set."""

    def __init__(self, config: DeviceConfig, context: zmq.Context | None = None) -> None:
        self.config = config
        self.ctx = context or zmq.Context()
        self.fqdn = pysocket.getfqdn()
        self._fqdn = self.fqdn.encode()
        self.heartbeat_address = f"tcp://{self.fqdn}:{config.pub_port}".encode()
        self._device_id = config.device_id
        stamp.device_bytes(config.device_id)  # range check
        self._device_label = str(config.device_id).encode()
        self._compress = int(config.compress)

        Counters.__init__(self)

        linger = config.linger_ms
        self.router = sockets.socket(self.ctx, zmq.ROUTER, linger_ms=linger, rcvhwm=config.rcv_hwm, sndhwm=config.rcv_hwm)
        self.pull = sockets.socket(self.ctx, zmq.PULL, linger_ms=linger, rcvhwm=config.rcv_hwm)
        # XPUB in manual mode: a subscription counts only once `_welcome` applied it.
        self.pub = sockets.socket(self.ctx, zmq.XPUB, linger_ms=linger, sndhwm=config.snd_hwm, xpub_manual=1)
        self.stats = sockets.socket(self.ctx, zmq.PUB, linger_ms=linger)
        self._native: NativeBatch | None = None
        # LOGJAM_NATIVE picks the loop (logjam.native); `require` raises here without a build.
        # Loaded even with --compress, so that `require` checks the build in every device.
        loaded = native.load()
        if loaded is not None and not self._compress:  # the C loop does not compress
            self._native = NativeBatch(*loaded)
            self._native_router = NativeBatch(*loaded)
            self._pull_handle = loaded[0].cast("void *", self.pull.underlying)
            self._router_handle = loaded[0].cast("void *", self.router.underlying)
        self.engine = "native" if self._native is not None else "python"
        # CURVE is a socket option set before bind: the C loop reads the same (decrypted) sockets.
        self.gate: Gatekeeper | None = None
        if config.curve is not None and config.curve.key is not None:
            self.gate = Gatekeeper(self.ctx, config.curve.allow_dir)
            self.gate.start()
        for sock, name, port in (
            (self.router, "router", config.router_port),
            (self.pull, "pull", config.pull_port),
            (self.pub, "pub", config.pub_port),
            (self.stats, "stats", config.stats_port),
        ):
            endpoint = f"tcp://{config.bind}:{port}"
            self._secure(sock, name, endpoint)
            sock.bind(endpoint)

        self.journal: Journal | None = None
        self.health = JournalHealth()
        self._held: Held | None = None
        self.replay: ReplayServer | None = None
        self._replay_stop = threading.Event()
        if config.data_dir is not None:
            self._open_journal(config)
            self.journal_id = self.journal.journal_id  # type: ignore[union-attr]
        else:
            # No journal: numbering restarts at 1 with every start, so does the identity.
            self.journal_id = new_journal_id()
        self.lag = ImporterLag(self.journal_id, config.max_importer_lag, config.importer_evict_after,
                               max_messages=config.max_importer_lag_messages)
        self._start_replay(config)

    def _secure(self, sock: zmq.Socket, name: str, endpoint: str) -> None:
        """Make `sock` a CURVE server watched by the gatekeeper, unless --allow-plaintext leaves it open."""
        curve = self.config.curve
        if curve is None or self.gate is None or not curve.secured(name):
            return
        curve.key.apply(sock, name)  # type: ignore[union-attr]
        self.gate.watch(sock, name, endpoint)

    def _open_journal(self, config: DeviceConfig) -> None:
        """Open (and recover) the journal and continue its numbering."""
        journal = Journal(
            f"{config.data_dir}/journal",
            fsync=config.journal_fsync,
            fsync_interval_ms=config.journal_fsync_interval_ms,
            segment_bytes=config.journal_segment_bytes,
            retention_bytes=config.journal_retention_bytes or None,
            retention_s=config.journal_retention_hours * 3600 or None,
        )
        self.journal = journal
        self.seq = journal.last_seq

    def _start_replay(self, config: DeviceConfig) -> None:
        """The replay endpoint: ranges and `info` with a journal, `info` alone without one."""
        endpoint = f"tcp://{config.bind}:{config.replay_port}"
        replay = ReplayServer(self.ctx, self.journal, endpoint, self._replay_stop,
                              journal_id=self.journal_id, last_seq=lambda: self.seq, on_progress=self.lag.progress,
                              secure=lambda sock: self._secure(sock, "replay", endpoint))
        replay.start()
        # The replay socket is created and bound in its own thread; wait for the outcome so
        # that a port in use fails the start like any other port.
        while not replay.bound.wait(0.05):
            if not replay.is_alive():
                break
        if replay.error is not None or not replay.is_alive():
            if self.journal is not None:
                raise RuntimeError(f"cannot bind the replay port {config.replay_port}: {replay.error}")
            # Without a journal it only answers `info` (heartbeats carry the same): not worth failing for.
            log.warning("replay port %d: %s; `info` is not served", config.replay_port, replay.error)
            return
        self.replay = replay

    # -- the one place where messages are numbered and published -----------------

    def _commit(self, batch: "TupleBatch | NativeBatch", then: Callable[[], None] | None = None) -> None:
        """Number every message of `batch`, journal the numbered batch, publish it, then call `then`.

        The batch is either Python tuples or the C fast path's zmq_msg_t array; both
        number, journal and publish the same way. The journal append comes before
        anything is published or acknowledged (`then` sends the replies). If it fails
        (a full disk), nothing of the batch was published or acknowledged: the device
        holds it, reads nothing more, and `_retry_held` writes it later.
        """
        first = self.seq + 1
        n = batch.number(self._device_id, first, now_ms())
        journal = self.journal
        if journal is not None:
            try:
                batch.journal(journal, first)
            except JournalWriteError as e:
                self._held = Held(batch, first, n, then)
                self.health.failed(e, n)
                return
            if not self.health.writable:
                self.health.recovered()
        self._published(batch, n, then)

    def _published(self, batch: "TupleBatch | NativeBatch", n: int, then: Callable[[], None] | None) -> None:
        self.seq += n
        batch.publish(self.pub)
        self.lag.published(self.seq, time.monotonic())
        self.published += n
        if then is not None:
            then()

    def _retry_held(self) -> bool:
        """Write the held batch again; on success publish and answer it. True when nothing is held any more."""
        held = self._held
        if held is None:
            return True
        try:
            held.batch.journal(self.journal, held.first)
        except JournalWriteError as e:
            self.health.failed(e, held.count)
            return False
        self._held = None
        self.health.recovered()
        self._published(held.batch, held.count, held.then)
        return True

    # -- input -------------------------------------------------------------------

    def _drain_pull(self) -> int:
        """Take up to BATCH messages from PULL, check them, and commit the good ones."""
        sock = self.pull
        recv = _recv
        per_app = self.per_app_env
        topics = self._topics
        heads = HEADS
        compress_to = self._compress
        batch = TupleBatch()
        add = batch.append
        n = 0
        while n < BATCH:
            try:
                f1 = recv(sock, _NB, False)
            except _Again:
                break
            n += 1
            # Unrolled for the 3- and 4-frame shapes: no list, one branch per frame.
            if f1.more:
                f2 = recv(sock, 0, False)
                if f2.more:
                    f3 = recv(sock, 0, False)
                    if f3.more:
                        f4 = recv(sock, 0, False)
                        if f4.more:
                            while f4.more:
                                f4 = recv(sock, 0, False)
                            self._drop("frame_count", f1.bytes)
                            continue
                        meta = f4.bytes
                        if len(meta) != META_SIZE or meta[META_HEAD] not in heads:
                            self._drop("broken_meta", f1.bytes)
                            continue
                    else:
                        meta = FRESH_META  # a legacy client without meta
                    app = f1.bytes
                    c = per_app.get(app)
                    if c is None and not self._new_app_env(app):
                        self._drop("bad_app_env", None)
                        continue
                    topic = f2.bytes
                    if topic not in topics and not self._new_topic(topic):
                        self._drop("bad_topic", app)
                        continue
                    if c is None:
                        self._count_app_env(app)
                    else:
                        per_app[app] = c + 1
                    if compress_to and meta[META_COMPRESSION_AT] == 0:
                        add((app, topic, compress(compress_to, f3.bytes), stamp.with_compression(meta, compress_to)))
                    else:
                        add((app, topic, f3, meta))
                    continue
            self._drop("frame_count", f1.bytes)
        self.received["pull"] += n
        if batch:
            self._commit(batch)
        return n

    def _drain_pull_native(self) -> int:
        """The PULL drain of the C fast path: checks run in C, Python only does bookkeeping per batch."""
        batch = self._native
        assert batch is not None
        taken = batch.drain(self._pull_handle, BATCH)
        if taken <= 0:
            if taken < 0:
                raise zmq.ZMQError(-taken)
            return 0
        self.received["pull"] += taken
        self._account_native(batch)
        if len(batch):
            self._commit(batch)
        return taken

    def _drain_router_native(self) -> int:
        """ROUTER on the C fast path: as for PULL, then the replies, after the publish."""
        batch = self._native_router
        taken = batch.drain_router(self._router_handle, BATCH)
        if taken <= 0:
            if taken < 0:
                raise zmq.ZMQError(-taken)
            return 0
        pings = batch.b.pings
        self.received["router"] += taken - pings
        self.pings += pings
        self._account_native(batch)
        then = self._native_reply if batch.b.nreplies else None
        if len(batch):
            self._commit(batch, then)
        elif then is not None:
            then()
        return taken

    def _native_reply(self) -> None:
        self._native_router.reply(self._router_handle, self._fqdn)

    def _account_native(self, batch: NativeBatch) -> None:
        """Per-batch bookkeeping of the C path: drops, and accepted messages per stream."""
        if batch.b.ndrops:
            for reason, app in batch.drops():
                self._drop(reason, None if reason == "bad_app_env" else app)
        if len(batch):
            per_app = self.per_app_env
            for app, count in batch.app_env_counts():
                if app in per_app:
                    per_app[app] += count
                elif len(per_app) < NAME_CACHE:
                    per_app[app] = count
                else:
                    self.other_app_envs += count

    def _drain_router(self) -> int:
        """Take up to BATCH messages from ROUTER; commit the good ones, then answer requests."""
        sock = self.router
        recv = _recv
        per_app = self.per_app_env
        topics = self._topics
        heads = HEADS
        compress_to = self._compress
        batch = TupleBatch()
        add = batch.append
        replies: list[tuple[bytes, bytes, bytes | None]] = []
        answer = replies.append
        n = 0
        pings = 0
        while n < BATCH:
            try:
                f = recv(sock, _NB, False)
            except _Again:
                break
            n += 1
            parts = [f]
            while f.more:
                f = recv(sock, 0, False)
                parts.append(f)
            rid = parts[0].bytes
            request = len(parts) > 1 and len(parts[1]) == 0
            first = 2 if request else 1
            count = len(parts) - first
            app = parts[first].bytes if count > 0 else b""

            if request and count >= 1 and app == PING:
                pings += 1
                answer(self._ping(rid, parts))
                continue

            if count != 4:
                self._drop("frame_count", app if count > 0 else None)
                if request:
                    answer((rid, app, BAD_REQUEST))
                continue
            meta = parts[first + 3].bytes
            if len(meta) != META_SIZE or meta[META_HEAD] not in heads:
                self._drop("broken_meta", app)
                if request:
                    answer((rid, app, BAD_REQUEST))
                continue
            c = per_app.get(app)
            if c is None and not self._new_app_env(app):
                self._drop("bad_app_env", None)
                if request:
                    answer((rid, app, BAD_REQUEST))
                continue
            topic = parts[first + 1].bytes
            if topic not in topics and not self._new_topic(topic):
                self._drop("bad_topic", app)
                if request:
                    answer((rid, app, BAD_REQUEST))
                continue
            if c is None:
                self._count_app_env(app)
            else:
                per_app[app] = c + 1
            body = parts[first + 2]
            if compress_to and meta[META_COMPRESSION_AT] == 0:
                body = compress(compress_to, body.bytes)
                meta = stamp.with_compression(meta, compress_to)
            add((app, topic, body, meta))
            if request:
                answer((rid, app, ACCEPTED))
        self.received["router"] += n - pings
        self.pings += pings
        then = (lambda: self._reply(replies)) if replies else None
        if batch:
            self._commit(batch, then)
        elif then is not None:
            then()
        return n

    def _ping(self, rid: bytes, parts: list) -> tuple[bytes, bytes, bytes | None]:
        """["", "ping", app-env, body, meta]: never published, answered at once."""
        count = len(parts) - 2
        if count == 4 and stamp.meta_ok(parts[5].bytes):
            return (rid, PING, PONG)
        self._drop("frame_count" if count != 4 else "broken_meta", parts[3].bytes if count > 1 else None)
        return (rid, PING, None)

    def _reply(self, replies: list[tuple[bytes, bytes, bytes | None]]) -> None:
        """Answers go out after the publish; ROUTER drops them for peers that are gone."""
        sock = self.router
        fqdn = self.fqdn.encode()
        for rid, first, status in replies:
            try:
                _send(sock, rid, _SM | _NB)
                if first == PING:
                    if status is None:
                        _send(sock, PING, _SM | _NB)
                        _send(sock, BAD_REQUEST, _NB)
                    else:
                        _send(sock, PING, _SM | _NB)
                        _send(sock, PONG, _SM | _NB)
                        _send(sock, fqdn, _NB)
                else:
                    _send(sock, first, _SM | _NB)
                    _send(sock, status, _NB)
            except _Again:
                # The client stopped reading its replies; it will time out, others go on.
                log.debug("reply to a blocked client dropped")

    # -- timers ----------------------------------------------------------------

    def heartbeat(self) -> None:
        """Publish (and journal) a heartbeat: `{"journal": id, "first": oldest seq still held}`."""
        # Without a journal nothing older than this heartbeat can be had: `first` is its own seq.
        first = self.journal.first_seq if self.journal is not None else self.seq + 1
        body = b'{"journal":"%s","first":%d}' % (self.journal_id.encode(), first)
        self._commit(TupleBatch([(HEARTBEAT, self.heartbeat_address, body, FRESH_META)]), self._count_heartbeat)

    def _count_heartbeat(self) -> None:
        self.heartbeats += 1
        self.last_heartbeat = time.monotonic()

    def _welcome(self) -> None:
        """Apply the subscriptions that arrived since the last call, then publish a heartbeat.

        In manual mode a subscriber gets nothing until its subscription is applied here,
        so the heartbeat (with the journal id) is the first message it receives.
        """
        pub = self.pub
        new = False
        while True:
            try:
                event = _recv(pub, _NB)
            except _Again:
                break
            if event[:1] == b"\x01":
                pub.setsockopt(zmq.SUBSCRIBE, event[1:])
                new = True
            elif event[:1] == b"\x00":
                pub.setsockopt(zmq.UNSUBSCRIBE, event[1:])
        if new:
            self.heartbeat()

    def publish_stats(self) -> None:
        """["stats", device id, last seq, JSON: journal id and whether it can be written]."""
        s = self.stats
        _send(s, STATS, _SM)
        _send(s, self._device_label, _SM)
        _send(s, str(self.seq).encode(), _SM)
        _send(s, json.dumps({"journal": self.journal_id, **self.health.stats()}, separators=(",", ":")).encode())

    # -- loop --------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Serve until `stop` is set, then take in what is already queued and return."""
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pull, zmq.POLLIN)
        interval = self.config.heartbeat_interval
        now = time.monotonic()
        next_heartbeat = now + interval
        next_stats = now + 1.0
        next_welcome = now
        # The journal's timer: interval fsyncs (when idle; appends sync too) and retention.
        tick_every = min(1.0, max(0.01, self.config.journal_fsync_interval_ms / 1000))
        next_tick = now + tick_every if self.journal is not None else float("inf")
        monotonic = time.monotonic
        drain_pull = self._drain_pull_native if self._native is not None else self._drain_pull
        drain_router = self._drain_router_native if self._native is not None else self._drain_router
        with sockets.eterm_is_clean():
            self.heartbeat()  # the journal id, before anything else is published or journaled
            while not stop.is_set():
                busy = 0
                now = monotonic()
                if self._held is None and self.lag.admit(now):
                    busy = drain_pull()
                    if self._held is None:
                        busy += drain_router()
                elif self._held is None:
                    # Importers are behind: inputs stay unread, so clients see a slow device.
                    time.sleep(0.02)
                now = monotonic()
                if now >= next_stats:
                    self.publish_stats()
                    next_stats = max(next_stats + 1.0, now + 0.5)
                if now >= next_tick:
                    self._tick()
                    next_tick = now + tick_every
                if self._held is not None:
                    if self.health.due(now) and self._retry_held():
                        continue
                    # The inputs stay unread (they would wake a poll at once): clients see a
                    # slow device, and their own high-water marks and back-pressure hold them.
                    time.sleep(0.05)
                    continue
                if now >= next_welcome:
                    self._welcome()
                    next_welcome = now + WELCOME_EVERY
                if now >= next_heartbeat:
                    self.heartbeat()
                    next_heartbeat = max(next_heartbeat + interval, now + interval / 2)
                if not busy:
                    wait = min(next_stats, next_heartbeat, next_tick, next_welcome) - now
                    # Short waits keep SIGTERM handling prompt.
                    poller.poll(max(1, min(200, int(wait * 1000) + 1)))
            self._final_drain()

    def _tick(self) -> None:
        """The journal's timer; a failed fsync there is a failed write too (counted, logged once)."""
        try:
            synced = self.journal.tick()  # type: ignore[union-attr]
        except JournalWriteError as e:
            self.health.failed(e, self._held.count if self._held is not None else 0)
            return
        if synced and self._held is None and not self.health.writable:
            self.health.recovered()

    def _final_drain(self, budget_s: float = 1.0) -> None:
        """On shutdown, publish what already sits in our input queues (bounded in time)."""
        deadline = time.monotonic() + budget_s
        while self._retry_held() and time.monotonic() < deadline:
            if self._native is not None:
                busy = self._drain_pull_native() + self._drain_router_native()
            else:
                busy = self._drain_pull() + self._drain_router()
            if not busy and self._held is None:
                return
        if self._held is not None:
            log.warning("stopping with %d messages the journal could not take: never published nor acknowledged",
                        self._held.count)

    def close(self) -> None:
        """Stop replay, close the journal (fsync), close sockets with LINGER, end the context."""
        if self.replay is not None:
            self._replay_stop.set()
            self.replay.join(5)
        if self.journal is not None:
            self.journal.close()
        if self._native is not None:
            self._native.discard()
            self._native_router.discard()
        for sock in (self.router, self.pull, self.pub, self.stats):
            sock.close()
        if self.gate is not None:
            self.gate.close()
        self.ctx.term()
