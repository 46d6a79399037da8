"""The device's input: draining ROUTER and PULL, checking every message, and answering requests.

Throughput decides the shape of this module. ZeroMQ's own cost per message is fixed;
what we control is the Python work per message, so:

- input is drained in batches of up to BATCH messages with NOBLOCK (the device's loop
  consults the poller only when both input sockets are empty);
- frames are received as `zmq.Frame` objects because a Frame carries its RCVMORE
  flag, whereas asking the socket for RCVMORE costs more than the receive itself;
- socket methods are the backend's unbound C methods, skipping pyzmq's Python
  wrappers (`send_multipart` alone costs more than the rest of the loop);
- checks are cache lookups on raw bytes (valid stream names and topics are
  remembered), and the only new object per message is the 24-byte meta.

Where it was built, both input sockets instead take the C fast path in
`devices.native`, which holds a whole batch as zmq_msg_t's and never makes a Python
object per message; the one Python drain (`Intake.drain_python`, for ROUTER and PULL
alike) is the fallback (LOGJAM_NATIVE=off, no build, and always with --compress).

Accepted messages go to the device's `commit` (numbered, journaled, published); the
replies to requests are sent only after it, so a 202 is never ahead of the journal or
the publish.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import zmq
from zmq.backend import Socket as _RawSocket

from logjam.compression import compress
from logjam.constants import ACCEPTED, BAD_REQUEST, PONG
from logjam.meta import META_COMPRESSION_AT, META_HEAD, META_SIZE
from devices import stamp
from devices.batch import TupleBatch
from devices.counters import Counters
from devices.fair import PING, Fairness, Reply
from devices.native import NativeBatch
from devices.stamp import FRESH_META, HEADS

log = logging.getLogger("logjam-device")

# Messages taken from one socket before the other gets its turn (and before timers
# are looked at); big enough to amortise the loop, small enough to stay fair.
BATCH = 1000

_NB = zmq.NOBLOCK
_SM = zmq.SNDMORE
_recv = _RawSocket.recv
_send = _RawSocket.send
_Again = zmq.Again

Commit = Callable[[TupleBatch | NativeBatch, Callable[[], None] | None], None]


class Intake:
    """Reads ROUTER and PULL for the device: `drains` (PULL, ROUTER) are the C path where it was built."""

    def __init__(self, counters: Counters, commit: Commit, router: zmq.Socket, pull: zmq.Socket, *,
                 compress: int, fqdn: bytes, loaded: tuple[Any, Any] | None) -> None:
        self.counters = counters
        self._commit = commit
        self.router = router
        self._compress = compress
        self._fqdn = fqdn
        self._native: NativeBatch | None = None
        self._native_router: NativeBatch | None = None
        self._router_handle: object = None
        self.drains: tuple[Callable[[], int], Callable[[], int]]
        if loaded is not None:
            ffi = loaded[0]
            self._native = NativeBatch(*loaded)
            self._native_router = NativeBatch(*loaded)
            pull_handle = ffi.cast("void *", pull.underlying)
            self._router_handle = ffi.cast("void *", router.underlying)
            self.drains = (lambda: self.drain_native(self._native, pull_handle, "pull"),  # type: ignore[arg-type]
                           lambda: self.drain_native(self._native_router, self._router_handle, "router"))  # type: ignore[arg-type]
        else:
            self.drains = (lambda: self.drain_python(pull, "pull"), lambda: self.drain_python(router, "router"))

    def drain_python(self, sock: zmq.Socket, source: str, fair: Fairness | None = None) -> int:
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
        replies: list[Reply] = []
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
        then = (lambda: self.reply(replies)) if replies else None
        if batch:
            self._commit(batch, then)
        elif then is not None:
            then()
        return n

    def _refuse(self, reason: str, label: bytes | None, rid: bytes, app: bytes, request: bool,
                answer: Callable[[Reply], None]) -> None:
        """Count a dropped message (under `label`); a request gets its 400."""
        self.counters.drop(reason, label)
        if request:
            answer((rid, app, BAD_REQUEST))

    def drain_native(self, batch: NativeBatch, handle: object, source: str) -> int:
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

    def _ping(self, rid: bytes, parts: list) -> Reply:
        """["", "ping", app-env, body, meta]: never published, answered at once."""
        count = len(parts) - 2
        if count == 4 and stamp.meta_ok(parts[5].bytes):
            return (rid, PING, PONG)
        self.counters.drop("frame_count" if count != 4 else "broken_meta", parts[3].bytes if count > 1 else None)
        return (rid, PING, None)

    def reply(self, replies: list[Reply]) -> None:
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

    def discard(self) -> None:
        """Free the C batches (the sockets are the device's to close)."""
        if self._native is not None:
            self._native.discard()
            self._native_router.discard()  # type: ignore[union-attr]
