"""Logjam messages as received, in columns: what a subscriber that sees every message needs to be cheap.

`RawBatch` holds a socket's waiting messages: their app-env, topic and body frames in one
`bytes` (offsets and lengths in `pos`, 6 per message) and their decoded meta in `meta`
(compression, device, created_ms, seq: 4 per message), with no object per message or
frame. An importer looks at every message's (device, seq) to keep its sequence in order,
but decodes only the streams it owns; building a `Message` per message cost more than all
the rest (native/sub_drain.c says how much).

`Drain` fills batches with the C function in native/sub_drain.c (built at install) when
LOGJAM_NATIVE allows it, else with pyzmq; both skip (and count) messages that are not 4
frames with a valid meta.
"""

from __future__ import annotations

import array
import logging
from dataclasses import dataclass
from typing import Any

import zmq

from logjam import native as _native
from logjam.meta import META_SIZE, META_STRUCT, META_TAG, META_TAG_SWAPPED, META_VERSION, Compression

log = logging.getLogger(__name__)

BUFFER_BYTES = 8 * 1024 * 1024
_META = META_STRUCT  # the one layout, from logjam.meta

MODULE = "logjam._native_sub"


@dataclass(frozen=True, slots=True)
class RawBatch:
    """`n` messages of one endpoint; message i's app-env is data[pos[6i]:pos[6i]+pos[6i+1]], and so on."""

    endpoint: str
    data: bytes
    pos: Any   # a sequence of ints: 6 per message
    meta: Any  # a sequence of ints: 4 per message
    n: int

    def frame(self, i: int, k: int) -> bytes:
        """Frame k (0 app-env, 1 topic, 2 body) of message i."""
        at = self.pos[6 * i + 2 * k]
        return self.data[at : at + self.pos[6 * i + 2 * k + 1]]


class Drain:
    """Reads the waiting messages of one SUB socket into RawBatches."""

    def __init__(self, sock: zmq.Socket, endpoint: str, *, native: bool = True, max_messages: int = 4096) -> None:
        self.sock = sock
        self.endpoint = endpoint
        self.max = max_messages
        self.bad = 0
        self._py_bad = 0
        self._c = _native.load(MODULE) if native else None
        if self._c is not None:
            ffi = self._c[0]
            self._state = ffi.new("lj_sub_t *")
            self._cap = BUFFER_BYTES
            self._buf = ffi.new("unsigned char[]", self._cap)
            self._pos = ffi.new("uint32_t[]", 6 * self.max)
            self._meta = ffi.new("uint64_t[]", 4 * self.max)
            self._used = ffi.new("size_t *")

    @property
    def native(self) -> bool:
        return self._c is not None

    def drain(self) -> RawBatch | None:
        """What is waiting now (None if nothing)."""
        return self._drain_c() if self._c is not None else self._drain_py()

    def _drain_c(self) -> RawBatch | None:
        ffi, lib = self._c  # type: ignore[misc]
        while True:
            n = lib.lj_sub_drain(self._state, ffi.cast("void *", self.sock.underlying), self.max, self._buf,
                                 self._cap, self._pos, self._meta, self._used)
            self.bad = self._state.bad
            if n == -2:  # one message larger than the buffer: grow it to fit
                self._cap = max(self._cap * 2, int(self._used[0]))
                self._buf = ffi.new("unsigned char[]", self._cap)
                continue
            if n < 0:
                raise zmq.ZMQError(zmq.zmq_errno())
            if n == 0:
                return None
            data = ffi.buffer(self._buf, self._used[0])[:]
            pos, meta = array.array("I"), array.array("Q")
            pos.frombytes(ffi.buffer(self._pos, 4 * 6 * n))
            meta.frombytes(ffi.buffer(self._meta, 8 * 4 * n))
            return RawBatch(self.endpoint, data, pos, meta, n)

    def _drain_py(self) -> RawBatch | None:
        parts: list[bytes] = []
        pos: list[int] = []
        meta: list[int] = []
        at = n = 0
        while n < self.max:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 4 or not _meta_ok(frames[3]):
                self._py_bad += 1
                continue
            for k in range(3):
                parts.append(frames[k])
                pos += (at, len(frames[k]))
                at += len(frames[k])
            _, compression, _, device, created, seq = _META.unpack(frames[3])
            meta += (compression, device, created, seq)
            n += 1
        self.bad = self._py_bad
        return RawBatch(self.endpoint, b"".join(parts), pos, meta, n) if n else None

    def close(self) -> None:
        if self._c is not None:
            self._c[1].lj_sub_close(self._state)


def _meta_ok(frame: bytes) -> bool:
    if len(frame) != META_SIZE:
        return False
    tag, compression, version = _META.unpack_from(frame)[:3]
    return tag in (META_TAG, META_TAG_SWAPPED) and version == META_VERSION and compression <= Compression.LZ4
