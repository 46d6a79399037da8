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
object per message; the one Python drain below (`_drain_python`, for ROUTER and PULL
alike) is the fallback (LOGJAM_NATIVE=off, no build, and always with --compress).

`Device(config)` only takes the configuration; `open()` (called by `run()` unless the
entry point called it first, to report a port in use before it says it started)
recovers the journal, creates and binds the sockets with LINGER set, and starts the
replay thread, all in the thread that then runs the loop, after any fork. ETERM is a
clean exit. What the device counts is its `counters` (devices/counters.py).

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
from pathlib import Path
from typing import Any, Callable

import zmq
from zmq.backend import Socket as _RawSocket

from logjam import endpoints, sockets
from logjam.constants import ACCEPTED, BAD_REQUEST, PONG
from logjam.compression import compress
from logjam.meta import META_COMPRESSION_AT, META_HEAD, META_SIZE, now_ms
from devices import listen, stamp
from devices import native
from devices.batch import TupleBatch
from devices.config import DeviceConfig
from devices.counters import Counters
from devices.fair import Fairness
from devices.hold import Held, JournalHealth
from devices.journal import Journal, JournalWriteError, new_journal_id
from devices.native import NativeBatch
from devices.lag import ImporterLag
from devices.replay import ReplayServer
from devices.stamp import FRESH_META, HEADS
from logjam.curve import ServerKey
from runtime.curve import Gatekeeper

__all__ = ["Device", "DeviceConfig", "TupleBatch"]

log = logging.getLogger("logjam-device")

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


class Device:
    """Holds the configuration, the counters and, once `open()`, the sockets; `run()` serves until `stop` is set."""

    def __init__(self, config: DeviceConfig, context: zmq.Context | None = None) -> None:
        self.config = config
        self.fqdn = pysocket.getfqdn()
        self._fqdn = self.fqdn.encode()
        self.heartbeat_address = f"tcp://{self.fqdn}:{config.pub_port}".encode()
        self._device_id = config.device_id
        stamp.device_bytes(config.device_id)  # range check
        self._device_label = str(config.device_id).encode()
        self._compress = int(config.compress)
        self.counters = Counters()
        self.seq = 0
        # LOGJAM_NATIVE picks the loop (logjam.native); `require` raises here without a build.
        # Loaded even with --compress, so that `require` checks the build in every device.
        loaded = native.load()
        self._loaded = loaded if not self._compress else None  # the C loop does not compress
        self.engine = "native" if self._loaded is not None else "python"
        self._context = context
        self.ctx: zmq.Context | None = None
        self.router = self.pull = self.pub = self.stats = None  # type: ignore[assignment]
        self._native: NativeBatch | None = None
        self._native_router: NativeBatch | None = None
        self._drains: tuple[Callable[[], int], Callable[[], int]] | None = None  # (PULL, ROUTER), set by open()
        self._router_handle: object = None
        self._thread: int | None = None
        self.gate: Gatekeeper | None = None
        self._server_key: ServerKey | None = None  # CURVE's key pair, read by open()
        self.journal: Journal | None = None
        self.health = JournalHealth()
        self._held: Held | None = None
        self.replay: ReplayServer | None = None
        self._replay_stop = threading.Event()
        self.journal_id = ""
        self.lag: ImporterLag | None = None
        self.fair = Fairness(self.counters, config.max_importer_lag)
        self.ipc_dir: Path | None = None  # set by open(): where the ipc endpoints are, if any

    def open(self) -> "Device":
        """Recover the journal, bind the sockets and start the replay endpoint, in the thread that runs the loop."""
        if self._thread is not None:
            return self
        config = self.config
        if config.curve is not None and config.curve.secret is not None:
            self._server_key = config.curve.load()  # first: a missing key file stops the start before anything exists
        self.ctx = self._context or zmq.Context()
        if config.data_dir is not None and config.ipc:
            self.ipc_dir = listen.open_ipc_dir(config.data_dir)
        self._bind(config)
        if config.data_dir is not None:
            self._open_journal(config)
            self.journal_id = self.journal.journal_id  # type: ignore[union-attr]
        else:
            # No journal: numbering restarts at 1 with every start, so does the identity.
            self.journal_id = new_journal_id()
        self.lag = ImporterLag(self.journal_id, config.max_importer_lag, config.importer_evict_after,
                               max_messages=config.max_importer_lag_messages)
        self._start_replay(config)
        self._thread = threading.get_ident()
        return self

    def _bind(self, config: DeviceConfig) -> None:
        """Create the loop's four sockets (LINGER set) and bind them; choose the drains that read them."""
        linger = config.linger_ms
        ctx = self.ctx
        self.router = sockets.socket(ctx, zmq.ROUTER, linger_ms=linger, rcvhwm=config.rcv_hwm, sndhwm=config.rcv_hwm)
        self.pull = sockets.socket(ctx, zmq.PULL, linger_ms=linger, rcvhwm=config.rcv_hwm)
        # XPUB in manual mode: a subscription counts only once `_welcome` applied it.
        self.pub = sockets.socket(ctx, zmq.XPUB, linger_ms=linger, sndhwm=config.snd_hwm, xpub_manual=1)
        self.stats = sockets.socket(ctx, zmq.PUB, linger_ms=linger)
        if self._loaded is not None:
            ffi = self._loaded[0]
            self._native = NativeBatch(*self._loaded)
            self._native_router = NativeBatch(*self._loaded)
            pull = ffi.cast("void *", self.pull.underlying)
            self._router_handle = ffi.cast("void *", self.router.underlying)
            self._drains = (lambda: self._drain_native(self._native, pull, "pull"),  # type: ignore[arg-type]
                            lambda: self._drain_native(self._native_router, self._router_handle, "router"))  # type: ignore[arg-type]
        else:
            self._drains = (lambda: self._drain_python(self.pull, "pull"), lambda: self._drain_python(self.router, "router"))
        # CURVE is a socket option set before bind: the C loop reads the same (decrypted) sockets.
        if config.curve is not None and self._server_key is not None:
            self.gate = Gatekeeper(ctx, config.curve.allow_dir)
            self.gate.start()
        for sock, name, port in (
            (self.router, "router", config.router_port),
            (self.pull, "pull", config.pull_port),
            (self.pub, "pub", config.pub_port),
            (self.stats, "stats", config.stats_port),
        ):
            self._listen(sock, name, port)

    def _listen(self, sock: zmq.Socket, name: str, port: int) -> None:
        """Bind `sock` on its ipc endpoint (plaintext, this host only) and on its TCP port (CURVE)."""
        tcp = f"tcp://{self.config.bind}:{port}"
        ipc = endpoints.ipc_endpoint(self.ipc_dir, name) if self.ipc_dir is not None else None
        listen.bind(sock, tcp, ipc, lambda: self._secure(sock, name, tcp))

    def _secure(self, sock: zmq.Socket, name: str, endpoint: str) -> None:
        """Make `sock` a CURVE server watched by the gatekeeper, unless --allow-plaintext leaves it open."""
        curve = self.config.curve
        if curve is None or self.gate is None or self._server_key is None or not curve.secured(name):
            return
        self._server_key.apply(sock, name)
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
        replay = ReplayServer(self.ctx, self.journal, self._replay_stop,
                              journal_id=self.journal_id, last_seq=lambda: self.seq,
                              on_progress=self.lag.progress,  # type: ignore[union-attr]
                              listen=lambda sock: self._listen(sock, "replay", config.replay_port))
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
        self.lag.published(self.seq, time.monotonic())  # type: ignore[union-attr]
        self.counters.published += n
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

    def _drain_python(self, sock: zmq.Socket, source: str, fair: Fairness | None = None) -> int:
        """Take up to BATCH messages from ROUTER or PULL, check them, commit the good ones, then answer requests.

        PULL takes [app-env, topic, body] (a legacy client without meta) or [..., meta];
        ROUTER takes [identity, "", app-env, topic, body, meta] (a request, answered 202 or
        400, or a ping) or the same without the empty frame (not answered). With `fair`,
        the loud streams' messages and the replies queued behind them are parked instead.
        """
        routed = source == "router"
        recv = _recv
        counters = self.counters
        per_app = counters.per_app_env
        topics = counters.topics
        heads = HEADS
        compress_to = self._compress
        batch = TupleBatch()
        replies: list[tuple[bytes, bytes, bytes | None]] = []
        add, answer = (batch.append, replies.append) if fair is None else (fair.adder(batch), fair.answerer(replies))
        n = 0
        pings = 0
        rid = b""
        request = False
        first = 0
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
            if routed:
                rid = parts[0].bytes
                request = len(parts) > 1 and len(parts[1]) == 0
                first = 2 if request else 1
            count = len(parts) - first
            app = parts[first].bytes if count > 0 else b""
            if request and app == PING:
                pings += 1
                answer(self._ping(rid, parts))
                continue
            if count == 4:
                meta = parts[first + 3].bytes
                if len(meta) != META_SIZE or meta[META_HEAD] not in heads:
                    self._refuse("broken_meta", app, rid, app, request, answer)
                    continue
            elif count == 3 and not routed:
                meta = FRESH_META  # a legacy client without meta
            else:
                self._refuse("frame_count", app if count > 0 else None, rid, app, request, answer)
                continue
            c = per_app.get(app)
            if c is None and not counters.new_app_env(app):
                self._refuse("bad_app_env", None, rid, app, request, answer)
                continue
            topic = parts[first + 1].bytes
            if topic not in topics and not counters.new_topic(topic):
                self._refuse("bad_topic", app, rid, app, request, answer)
                continue
            if c is None:
                counters.count_app_env(app)
            else:
                per_app[app] = c + 1
            body = parts[first + 2]
            if compress_to and meta[META_COMPRESSION_AT] == 0:
                body = compress(compress_to, body.bytes)
                meta = stamp.with_compression(meta, compress_to)
            add((app, topic, body, meta))
            if request:
                answer((rid, app, ACCEPTED))
        counters.received[source] += n - pings
        counters.pings += pings
        then = (lambda: self._reply(replies)) if replies else None
        if batch:
            self._commit(batch, then)
        elif then is not None:
            then()
        return n

    def _refuse(self, reason: str, label: bytes | None, rid: bytes, app: bytes, request: bool,
                answer: Callable[[tuple[bytes, bytes, bytes | None]], None]) -> None:
        """Count a dropped message (under `label`); a request gets its 400."""
        self.counters.drop(reason, label)
        if request:
            answer((rid, app, BAD_REQUEST))

    def _drain_native(self, batch: NativeBatch, handle: object, source: str) -> int:
        """The C fast path: drain and check in C; Python counts per batch, commits, then replies (ROUTER)."""
        routed = source == "router"
        taken = batch.drain_router(handle, BATCH) if routed else batch.drain(handle, BATCH)
        if taken <= 0:
            if taken < 0:
                raise zmq.ZMQError(-taken)
            return 0
        counters = self.counters
        pings = batch.b.pings if routed else 0
        counters.received[source] += taken - pings
        counters.pings += pings
        if batch.b.ndrops:
            for reason, app in batch.drops():
                counters.drop(reason, None if reason == "bad_app_env" else app)
        if len(batch):
            counters.count_batch(batch.app_env_counts())
        then = self._native_reply if routed and batch.b.nreplies else None
        if len(batch):
            self._commit(batch, then)
        elif then is not None:
            then()
        return taken

    def _native_reply(self) -> None:
        self._native_router.reply(self._router_handle, self._fqdn)  # type: ignore[union-attr]

    def _ping(self, rid: bytes, parts: list) -> tuple[bytes, bytes, bytes | None]:
        """["", "ping", app-env, body, meta]: never published, answered at once."""
        count = len(parts) - 2
        if count == 4 and stamp.meta_ok(parts[5].bytes):
            return (rid, PING, PONG)
        self.counters.drop("frame_count" if count != 4 else "broken_meta", parts[3].bytes if count > 1 else None)
        return (rid, PING, None)

    def _reply(self, replies: list[tuple[bytes, bytes, bytes | None]]) -> None:
        """Answers go out after the publish; ROUTER drops them for peers that are gone."""
        sock = self.router
        fqdn = self._fqdn
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
        self._commit(TupleBatch([(HEARTBEAT, self.heartbeat_address, body, FRESH_META)]), self.counters.heartbeat)

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
        """Serve until `stop` is set, then take in what is already queued and return.

        Opens the device first unless `open()` was called; either way in this thread, the
        one its sockets belong to.
        """
        self.open()
        if self._thread != threading.get_ident():
            raise RuntimeError("Device.run must run in the thread that opened it (ZeroMQ sockets are not thread-safe)")
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
        with sockets.eterm_is_clean():
            self.heartbeat()  # the journal id, before anything else is published or journaled
            while not stop.is_set():
                busy = 0
                now = monotonic()
                if self._held is None:
                    busy = self._serve(now)
                    if busy < 0:
                        # Importers are behind: inputs stay unread, so clients see a slow device.
                        busy = 0
                        time.sleep(0.02)
                now = monotonic()
                if now >= next_stats:
                    self.publish_stats()
                    self.fair.tick()
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

    def _serve(self, now: float) -> int:
        """Read the inputs; past the fair limit park the loud streams (past the hard one, until under it).

        -1: nothing was read because importers are too far behind (the caller waits a little):
        past the hard limit with no loud stream to park, as before devices/fair.py."""
        fair, lag = self.fair, self.lag
        admit = lag.admit(now)  # type: ignore[union-attr]
        if fair.pressing(lag.worst):  # type: ignore[union-attr]
            # Past the hard limit the loud streams stay parked, as every stream's input stayed unread before.
            if admit and fair.overdue(now):
                self._unpark()
                if self._held is not None:
                    return 1
            if fair.full():
                return -1
            before = len(fair.parked)
            busy = self._drain_python(self.pull, "pull", fair)
            if self._held is None:
                busy += self._drain_python(self.router, "router", fair)
            fair.parking(before)
            return busy
        if not admit:
            return -1
        if fair.parked or fair.replies:
            self._unpark()
            if self._held is not None:
                return 1
        drain_pull, drain_router = self._drains  # type: ignore[misc]
        busy = drain_pull()
        if self._held is None:
            busy += drain_router()
        return busy

    def _unpark(self) -> None:
        """Commit the parked messages (in arrival order, before anything newer), then send the parked replies."""
        batch, replies = self.fair.release()
        then = (lambda: self._reply(replies)) if replies else None
        if batch:
            self._commit(batch, then)
        elif then is not None:
            then()

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
        if self._held is None:
            self._unpark()  # never acknowledged, but already here: publish them rather than make their senders resend
        drain_pull, drain_router = self._drains  # type: ignore[misc]
        while self._retry_held() and time.monotonic() < deadline:
            busy = drain_pull() + drain_router()
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
            self._native_router.discard()  # type: ignore[union-attr]
        for sock in (self.router, self.pull, self.pub, self.stats):
            if sock is not None:
                sock.close()
        if self.gate is not None:
            self.gate.close()
        if self.ctx is not None:
            self.ctx.term()

    def snapshot(self) -> dict[str, Any]:
        """The counters, the sequence, the journal and the importers' lag: what metrics and logs read."""
        return {"journal_id": self.journal_id, "seq": self.seq, **self.counters.snapshot(),
                "journal": self._journal_snapshot(), "importers": self._importers_snapshot(),
                "fair": self.fair.snapshot()}

    def _importers_snapshot(self) -> dict[str, Any]:
        lag = self.lag
        if lag is None:
            return {"lag": {}, "holding": False, "held_seconds": 0.0}
        now = time.monotonic()
        return {"lag": lag.lags(now), "holding": lag.holding, "held_seconds": lag.held_total(now)}

    def _journal_snapshot(self) -> dict[str, Any] | None:
        journal, replay = self.journal, self.replay
        if journal is None:
            return None
        return {
            "bytes": journal.size,
            "segments": journal.segment_count,
            "first_seq": journal.first_seq,
            "last_seq": journal.last_seq,
            "fsyncs": journal.fsyncs,
            "bytes_written": journal.bytes_written,
            "segments_deleted": journal.segments_deleted,
            **self.health.stats(),
            "replay_requests": replay.requests if replay else 0,
            "replay_messages": replay.served if replay else 0,
            "replay_bad_requests": replay.bad if replay else 0,
        }
