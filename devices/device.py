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

Where it can be built, both input sockets instead take the C fast path in
`devices.native`, which holds a whole batch as zmq_msg_t's and never makes a Python
object per message; the Python loop below is the fallback (`--engine python`, and
always with --compress).

Everything accepted goes through `_commit`, the one place where messages are
numbered, journaled (with --data-dir) and published, in that order. Replies to
requests are sent after `_commit`, so a 202 is never ahead of the journal or the
publish. The journal's replay endpoint runs in its own thread (devices/replay.py).
"""

from __future__ import annotations

import logging
import socket as pysocket
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.backend import Socket as _RawSocket

from logjam import lifecycle
from logjam.compression import compress
from logjam.meta import Compression, now_ms
from logjam.validation import is_valid_app_env, is_valid_topic
from devices import stamp
from devices import native
from devices.journal import Journal
from devices.native import NativeBatch
from devices.replay import ReplayServer
from devices.stamp import FRESH_META, HEADS, INVALID_LABEL, OTHER_LABEL, ZERO_MS

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
# Remembered valid stream names and topics; past this, new names are checked every
# time instead (a client inventing names must not grow the device without bound).
NAME_CACHE = 10_000
LABELS_MAX = 10_000

_NB = zmq.NOBLOCK
_SM = zmq.SNDMORE
_recv = _RawSocket.recv
_send = _RawSocket.send
_Again = zmq.Again


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    router_port: int = 9604
    pull_port: int = 9605
    pub_port: int = 9606
    stats_port: int = 9621
    bind: str = "*"
    device_id: int = 0
    compress: int = Compression.NONE
    rcv_hwm: int = 100_000
    snd_hwm: int = 1_000_000
    heartbeat_interval: float = 5.0
    linger_ms: int = lifecycle.DEFAULT_LINGER_MS
    # "auto": the C fast path for ROUTER and PULL when it can be built (and --compress is off),
    # "native": the same but fail if it cannot, "python": never.
    engine: str = "auto"
    # The journal: off without a data directory.
    data_dir: str | None = None
    journal_fsync: str = "interval"
    journal_fsync_interval_ms: int = 100
    journal_segment_bytes: int = 64 * 1024 * 1024
    journal_retention_bytes: int = 1024 * 1024 * 1024  # 0: no size limit
    journal_retention_hours: float = 24.0  # 0: no age limit
    replay_port: int = 9607


class TupleBatch(list):
    """Accepted messages as (app-env, topic, body, client meta); frames are bytes or zmq.Frame."""

    __slots__ = ("metas",)

    def number(self, device: int, first_seq: int, now: int) -> int:
        dev = stamp.device_bytes(device)
        now_b = now.to_bytes(8, "big")
        pack = stamp.pack_meta
        heads = HEADS
        seq = first_seq - 1
        metas = []
        add = metas.append
        for _, _, _, meta in self:
            seq += 1
            created = meta[8:16]
            add(pack(heads[meta[:4]], dev, now_b if created == ZERO_MS else created, seq))
        self.metas = metas
        return len(metas)

    def journal(self, journal: Journal, first_seq: int) -> None:
        journal.append(first_seq, [(a, t, b, m) for (a, t, b, _), m in zip(self, self.metas)])

    def publish(self, sock: zmq.Socket) -> None:
        send = _send
        metas = self.metas
        i = 0
        for app, topic, body, _ in self:
            send(sock, app, _SM)
            send(sock, topic, _SM)
            send(sock, body, _SM, False)
            send(sock, metas[i])
            i += 1


class Device:
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

        # Counters, read by the metrics collector from another thread (plain ints and
        # dicts: a scrape copies them; the loop never locks).
        self.seq = 0
        self.received = {"router": 0, "pull": 0}
        self.published = 0
        self.heartbeats = 0
        self.pings = 0
        self.per_app_env: dict[bytes, int] = {}
        self.other_app_envs = 0
        self.dropped: dict[tuple[str, str], int] = {}
        self._topics: set[bytes] = set()
        self._drop_labels: set[bytes] = set()

        linger = config.linger_ms
        self.router = lifecycle.socket(self.ctx, zmq.ROUTER, linger_ms=linger, rcvhwm=config.rcv_hwm, sndhwm=config.rcv_hwm)
        self.pull = lifecycle.socket(self.ctx, zmq.PULL, linger_ms=linger, rcvhwm=config.rcv_hwm)
        self.pub = lifecycle.socket(self.ctx, zmq.PUB, linger_ms=linger, sndhwm=config.snd_hwm)
        self.stats = lifecycle.socket(self.ctx, zmq.PUB, linger_ms=linger)
        self._native: NativeBatch | None = None
        if config.engine not in ("auto", "native", "python"):
            raise ValueError(f"engine must be auto, native or python, not {config.engine!r}")
        if config.engine != "python":
            if self._compress and config.engine == "native":
                raise ValueError("the native engine does not compress; use --engine python or auto")
            loaded = None if self._compress else native.load()
            if loaded is None and config.engine == "native":
                raise RuntimeError("the native engine could not be built (see the log)")
            if loaded is not None:
                self._native = NativeBatch(*loaded)
                self._native_router = NativeBatch(*loaded)
                self._pull_handle = loaded[0].cast("void *", self.pull.underlying)
                self._router_handle = loaded[0].cast("void *", self.router.underlying)
        self.engine = "native" if self._native is not None else "python"
        for sock, port in (
            (self.router, config.router_port),
            (self.pull, config.pull_port),
            (self.pub, config.pub_port),
            (self.stats, config.stats_port),
        ):
            sock.bind(f"tcp://{config.bind}:{port}")

        self.journal: Journal | None = None
        self.replay: ReplayServer | None = None
        self._replay_stop = threading.Event()
        if config.data_dir is not None:
            self._open_journal(config)

    def _open_journal(self, config: DeviceConfig) -> None:
        """Open (and recover) the journal, continue its numbering, and start the replay endpoint."""
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
        replay = ReplayServer(self.ctx, journal, f"tcp://{config.bind}:{config.replay_port}", self._replay_stop)
        replay.start()
        # The replay socket is created and bound in its own thread; wait for the outcome so
        # that a port in use fails the start like any other port.
        while not replay.bound.wait(0.05):
            if not replay.is_alive():
                break
        if replay.error is not None or not replay.is_alive():
            raise RuntimeError(f"cannot bind the replay port {config.replay_port}: {replay.error}")
        self.replay = replay

    # -- the one place where messages are numbered and published -----------------

    def _commit(self, batch: "TupleBatch | NativeBatch") -> None:
        """Number every message of `batch`, journal the numbered batch, then publish it.

        The batch is either Python tuples or the C fast path's zmq_msg_t array; both
        number, journal and publish the same way. The journal append comes before
        anything is published or acknowledged; if it fails (a full disk), the error
        stops the device and nothing of the batch was published or acknowledged.
        """
        first = self.seq + 1
        n = batch.number(self._device_id, first, now_ms())
        journal = self.journal
        if journal is not None:
            batch.journal(journal, first)
        self.seq += n
        batch.publish(self.pub)
        self.published += n

    # -- input -------------------------------------------------------------------

    def _drop(self, reason: str, app_env: bytes | None) -> None:
        if app_env is None:
            name = INVALID_LABEL
        else:
            name = self._label(app_env)
        key = (reason, name)
        self.dropped[key] = self.dropped.get(key, 0) + 1
        log.debug("dropped a message (%s) from %s", reason, name)

    def _label(self, app_env: bytes) -> str:
        """The drop label: valid names as themselves, at most LABELS_MAX of them."""
        if app_env in self.per_app_env or app_env in self._drop_labels:
            return app_env.decode("ascii")
        if not is_valid_app_env(app_env):
            return INVALID_LABEL
        if len(self._drop_labels) >= LABELS_MAX:
            return OTHER_LABEL
        self._drop_labels.add(app_env)
        return app_env.decode("ascii")

    def _new_app_env(self, app_env: bytes) -> bool:
        """Slow path of the stream-name check: validate, and remember it for the fast path."""
        if not is_valid_app_env(app_env):
            return False
        if len(self.per_app_env) < NAME_CACHE:
            self.per_app_env[app_env] = 0
        return True

    def _new_topic(self, topic: bytes) -> bool:
        if not is_valid_topic(topic):
            return False
        if len(self._topics) < NAME_CACHE:
            self._topics.add(topic)
        return True

    def _count_app_env(self, app_env: bytes) -> None:
        # Reached only for a name seen for the first time: it was just cached with 0,
        # or the cache is full and it is counted under one shared label.
        per = self.per_app_env
        if app_env in per:
            per[app_env] += 1
        else:
            self.other_app_envs += 1

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
                        if len(meta) != 24 or meta[:4] not in heads:
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
                    if compress_to and meta[2] == 0:
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
        if len(batch):
            self._commit(batch)
        if batch.b.nreplies:
            batch.reply(self._router_handle, self._fqdn)
        return taken

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
                # ["", "ping", app-env, body, meta]: never published, answered at once.
                if count == 4 and stamp.meta_ok(parts[5].bytes):
                    answer((rid, PING, PONG))
                else:
                    self._drop("frame_count" if count != 4 else "broken_meta", parts[3].bytes if count > 1 else None)
                    answer((rid, PING, None))
                continue

            if count != 4:
                self._drop("frame_count", app if count > 0 else None)
                if request:
                    answer((rid, app, BAD_REQUEST))
                continue
            meta = parts[first + 3].bytes
            if len(meta) != 24 or meta[:4] not in heads:
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
            if compress_to and meta[2] == 0:
                body = compress(compress_to, body.bytes)
                meta = stamp.with_compression(meta, compress_to)
            add((app, topic, body, meta))
            if request:
                answer((rid, app, ACCEPTED))
        self.received["router"] += n - pings
        self.pings += pings
        if batch:
            self._commit(batch)
        if replies:
            self._reply(replies)
        return n

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
        self._commit(TupleBatch([(HEARTBEAT, self.heartbeat_address, b"{}", FRESH_META)]))
        self.heartbeats += 1

    def publish_stats(self) -> None:
        s = self.stats
        _send(s, STATS, _SM)
        _send(s, self._device_label, _SM)
        _send(s, str(self.seq).encode())

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
        journal = self.journal
        # The journal's timer: interval fsyncs (when idle; appends sync too) and retention.
        tick_every = min(1.0, max(0.01, self.config.journal_fsync_interval_ms / 1000))
        next_tick = now + tick_every if journal is not None else float("inf")
        monotonic = time.monotonic
        drain_pull = self._drain_pull_native if self._native is not None else self._drain_pull
        drain_router = self._drain_router_native if self._native is not None else self._drain_router
        with lifecycle.eterm_is_clean():
            while not stop.is_set():
                busy = drain_pull() + drain_router()
                now = monotonic()
                if now >= next_stats:
                    self.publish_stats()
                    next_stats = max(next_stats + 1.0, now + 0.5)
                if now >= next_heartbeat:
                    self.heartbeat()
                    next_heartbeat = max(next_heartbeat + interval, now + interval / 2)
                if now >= next_tick:
                    journal.tick()  # type: ignore[union-attr]
                    next_tick = now + tick_every
                if not busy:
                    wait = min(next_stats, next_heartbeat, next_tick) - now
                    # Short waits keep SIGTERM handling prompt.
                    poller.poll(max(1, min(200, int(wait * 1000) + 1)))
            self._final_drain()

    def _final_drain(self, budget_s: float = 1.0) -> None:
        """On shutdown, publish what already sits in our input queues (bounded in time)."""
        deadline = time.monotonic() + budget_s
        while time.monotonic() < deadline:
            if self._native is not None:
                busy = self._drain_pull_native() + self._drain_router_native()
            else:
                busy = self._drain_pull() + self._drain_router()
            if not busy:
                break

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
        self.ctx.term()

    # -- for metrics and logs ------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """A consistent-enough copy of the counters (dict copies are atomic under the GIL)."""
        return {
            "seq": self.seq,
            "received": dict(self.received),
            "published": self.published,
            "heartbeats": self.heartbeats,
            "pings": self.pings,
            "per_app_env": {k.decode("ascii", "replace"): v for k, v in dict(self.per_app_env).items()}
            | ({OTHER_LABEL: self.other_app_envs} if self.other_app_envs else {}),
            "dropped": dict(self.dropped),
            "journal": self._journal_snapshot(),
        }

    def _journal_snapshot(self) -> dict[str, int] | None:
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
            "replay_requests": replay.requests if replay else 0,
            "replay_messages": replay.served if replay else 0,
            "replay_bad_requests": replay.bad if replay else 0,
        }
