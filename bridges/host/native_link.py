"""The device link's wire work in C: send a batch's requests and read the device's replies.

Why C: a Logjam request is five ZeroMQ frames and each reply two, and through pyzmq
every frame is a Python call (and every "is there more?" another). At tens of
thousands of events per second that was most of a bridge's CPU. native/link.c (built at
install, see native/build.py) does a whole batch per call on pyzmq's own socket
(`Socket.underlying`), with the same framing as `Message.to_frames()` and `Meta.pack()`:

- `lj_link_send` sends messages `[start, n)` of a `MessageBatch` laid out as one
  joined body buffer plus per-message lengths and created_ms, stopping (not blocking)
  at the high-water mark; it returns how many it sent.
- `lj_link_drain` reads every waiting reply (`[app-env, status]`) and classifies each: 202 Accepted, another
  status (the device refused the request), or a reply we do not understand.

`PyWire` does the same through pyzmq (LOGJAM_NATIVE=off, or no build); `wire()` picks one.
"""

from __future__ import annotations

import logging
from array import array
from typing import Any

import zmq

from logjam import native as _native
from logjam.constants import ACCEPTED
from logjam.message import MessageBatch
from logjam.meta import Meta

log = logging.getLogger(__name__)

MODULE = "bridges.host._native_link"
# Status codes that lj_link_drain writes per reply (LJ_REPLY_* in native/link.h).
OK, REFUSED, UNEXPECTED = 0, 1, 2
MAX_DRAIN = 4096


class NativeWire:
    """The C functions, with their scratch buffers."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi = ffi
        self.lib = lib
        self._status = ffi.new("unsigned char[]", MAX_DRAIN)
        self._nbad = ffi.new("int *")
        self._err = ffi.new("int *")

    def prepare(self, batch: MessageBatch) -> Any:
        """The batch's columns as C buffers (kept alive by the returned tuple)."""
        if batch.packed is not None:
            blob, lens = batch.packed
        else:
            blob = b"".join(batch.bodies)
            lens = array("I", map(len, batch.bodies))
        created = batch.created_ms if isinstance(batch.created_ms, array) else array("q", batch.created_ms)
        ffi = self.ffi
        return (blob, lens, created, ffi.from_buffer("unsigned char[]", blob),
                ffi.from_buffer("uint32_t[]", lens), ffi.from_buffer("int64_t[]", created))

    def send(self, sock: zmq.Socket, app: bytes, topic: bytes, compression: int, prepared: Any,
             start: int, n: int) -> int:
        sent = self.lib.lj_link_send(
            self.ffi.cast("void *", sock.underlying), app, len(app), topic, len(topic),
            prepared[3], prepared[4], prepared[5], start, n, compression, self._err,
        )
        if self._err[0]:
            raise zmq.ZMQError(self._err[0])
        return sent

    def drain(self, sock: zmq.Socket) -> tuple[int, bytes | None]:
        """(replies read, their statuses when any is not OK, else None)."""
        n = self.lib.lj_link_drain(self.ffi.cast("void *", sock.underlying), self._status, MAX_DRAIN,
                                   self._nbad, self._err)
        if self._err[0] and not n:
            raise zmq.ZMQError(self._err[0])
        return n, (bytes(self.ffi.buffer(self._status, n)) if self._nbad[0] else None)

    def count(self, sock: zmq.Socket, want: int) -> int:
        """Receive and count whole messages until `want`, or until RCVTIMEO passes without one."""
        return self.lib.lj_count(self.ffi.cast("void *", sock.underlying), want)


class PyWire:
    """The same operations through pyzmq, for machines that cannot build the C ones."""

    def prepare(self, batch: MessageBatch) -> Any:
        return (batch.body_list(), batch.created_ms)

    def send(self, sock: zmq.Socket, app: bytes, topic: bytes, compression: int, prepared: Any,
             start: int, n: int) -> int:
        bodies, created = prepared
        for i in range(start, n):
            meta = Meta(compression, 0, created[i], 0).pack()
            try:
                sock.send(b"", zmq.NOBLOCK | zmq.SNDMORE)
            except zmq.Again:
                return i - start
            sock.send_multipart([app, topic, bodies[i], meta])
        return n - start

    def drain(self, sock: zmq.Socket) -> tuple[int, bytes | None]:
        statuses = bytearray()
        while len(statuses) < MAX_DRAIN:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:
                statuses.append(UNEXPECTED)
            else:
                statuses.append(OK if frames[1] == ACCEPTED else REFUSED)
        n = len(statuses)
        return n, (bytes(statuses) if statuses.count(OK) != n else None)

    def count(self, sock: zmq.Socket, want: int) -> int:
        got = 0
        while got < want:
            try:
                sock.recv_multipart()
            except zmq.Again:
                break
            got += 1
        return got


def wire(native: bool = True) -> NativeWire | PyWire:
    """The C wire when LOGJAM_NATIVE allows it and it was built, else the Python one.
    `native=False` asks for the Python one whatever the switch says."""
    built = _native.load(MODULE) if native else None
    return NativeWire(*built) if built is not None else PyWire()
