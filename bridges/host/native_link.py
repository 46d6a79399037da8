"""The device link's wire work in C: send a batch's requests and read the device's replies.

Why C: a Logjam request is five ZeroMQ frames and each reply two, and through pyzmq
every frame is a Python call (and every "is there more?" another). At tens of
thousands of events per second that was most of a bridge's CPU. These two functions
do a whole batch per call on pyzmq's own socket (`Socket.underlying`), with the same
framing as `Message.to_frames()` and `Meta.pack()`:

- `lj_link_send` sends messages `[start, n)` of a `MessageBatch` laid out as one
  joined body buffer plus per-message lengths and created_ms, stopping (not blocking)
  at the high-water mark; it returns how many it sent.
- `lj_link_drain` reads every waiting reply (`[app-env, status]`) and classifies each: 202 Accepted, another
  status (the device refused the request), or a reply we do not understand.

`PyWire` does the same in Python for machines without a compiler; `wire()` picks one.
"""

from __future__ import annotations

import logging
from typing import Any

import zmq

from logjam.meta import META_TAG, META_VERSION, Meta
from logjam.native_build import load_module

log = logging.getLogger(__name__)

ACCEPTED = b"202 Accepted"
# Status codes that lj_link_drain writes per reply.
OK, REFUSED, UNEXPECTED = 0, 1, 2
MAX_DRAIN = 4096

CDEF = """
int lj_link_send(void *sock, const char *app, size_t app_len, const char *topic, size_t topic_len,
                 const unsigned char *blob, const uint32_t *lens, const int64_t *created,
                 int start, int n, unsigned int compression, int *err);
int lj_link_drain(void *sock, unsigned char *status, int max, int *nbad, int *err);
long lj_count(void *sock, long want);
"""

SOURCE = r"""
#include <stdint.h>
#include <string.h>
#include <errno.h>

int zmq_send(void *s, const void *buf, size_t len, int flags);
int zmq_recv(void *s, void *buf, size_t len, int flags);
int zmq_getsockopt(void *s, int option, void *optval, size_t *optvallen);
int zmq_errno(void);
#define LJ_DONTWAIT 1
#define LJ_SNDMORE 2
#define LJ_RCVMORE 13

int lj_link_send(void *sock, const char *app, size_t app_len, const char *topic, size_t topic_len,
                 const unsigned char *blob, const uint32_t *lens, const int64_t *created,
                 int start, int n, unsigned int compression, int *err)
{
    size_t off = 0;
    unsigned char meta[24];
    int i, k;
    *err = 0;
    for (i = 0; i < start; i++) off += lens[i];
    /* Meta.pack(): tag, compression, version, device 0, created_ms, sequence 0 (big-endian). */
    memset(meta, 0, sizeof meta);
    meta[0] = 0x""" + f"{META_TAG >> 8:02X}" + r"""; meta[1] = 0x""" + f"{META_TAG & 0xFF:02X}" + r""";
    meta[2] = (unsigned char)compression; meta[3] = """ + str(META_VERSION) + r""";
    for (i = start; i < n; i++) {
        uint64_t c = (uint64_t)created[i];
        if (zmq_send(sock, "", 0, LJ_DONTWAIT | LJ_SNDMORE) < 0) {
            int e = zmq_errno();
            if (e != EAGAIN) *err = e;
            break;
        }
        /* A multipart message is queued whole once its first frame is: these cannot block. */
        for (k = 0; k < 8; k++) meta[8 + k] = (unsigned char)(c >> (56 - 8 * k));
        zmq_send(sock, app, app_len, LJ_SNDMORE);
        zmq_send(sock, topic, topic_len, LJ_SNDMORE);
        zmq_send(sock, blob + off, lens[i], LJ_SNDMORE);
        zmq_send(sock, meta, sizeof meta, 0);
        off += lens[i];
    }
    return i - start;
}

static int lj_more(void *sock)
{
    int more = 0;
    size_t len = sizeof more;
    if (zmq_getsockopt(sock, LJ_RCVMORE, &more, &len) != 0) return 0;
    return more;
}

int lj_link_drain(void *sock, unsigned char *status, int max, int *nbad, int *err)
{
    unsigned char buf[32], st[32];
    int n = 0;
    *nbad = 0;
    *err = 0;
    while (n < max) {
        int frames = 1, r, st_len = -1;
        /* A reply is [app-env, status] (the device echoes the request's first data frame). */
        if (zmq_recv(sock, buf, sizeof buf, LJ_DONTWAIT) < 0) {
            int e = zmq_errno();
            if (e != EAGAIN) *err = e;
            break;
        }
        while (lj_more(sock)) {
            r = zmq_recv(sock, buf, sizeof buf, 0);
            if (r < 0) break;
            if (++frames == 2) {
                st_len = r;
                memcpy(st, buf, (size_t)r < sizeof st ? (size_t)r : sizeof st);
            }
        }
        if (frames != 2) status[n] = 2;
        else if (st_len == 12 && memcmp(st, "202 Accepted", 12) == 0) status[n] = 0;
        else status[n] = 1;
        if (status[n]) ++*nbad;
        n++;
    }
    return n;
}

long lj_count(void *sock, long want)
{
    unsigned char buf[8];
    long got = 0;
    while (got < want) {
        if (zmq_recv(sock, buf, sizeof buf, 0) < 0) break; /* RCVTIMEO, ETERM */
        while (lj_more(sock)) zmq_recv(sock, buf, sizeof buf, 0);
        got++;
    }
    return got;
}
"""


class NativeWire:
    """The C functions, with their scratch buffers."""

    def __init__(self, ffi: Any, lib: Any) -> None:
        self.ffi = ffi
        self.lib = lib
        self._status = ffi.new("unsigned char[]", MAX_DRAIN)
        self._nbad = ffi.new("int *")
        self._err = ffi.new("int *")

    def prepare(self, bodies: list[bytes], created_ms: list[int]) -> Any:
        """The batch's columns as C buffers (kept alive by the returned tuple)."""
        from array import array

        blob = b"".join(bodies)
        lens = array("I", map(len, bodies))
        created = array("q", created_ms)
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

    def prepare(self, bodies: list[bytes], created_ms: list[int]) -> Any:
        return (bodies, created_ms)

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


_loaded: list[Any] = []


def wire(native: bool = True) -> NativeWire | PyWire:
    """The C wire when it can be built (once per process), else the Python one."""
    if not native:
        return PyWire()
    if not _loaded:
        _loaded.append(load_module("_logjam_link_native", CDEF, SOURCE, log))
    built = _loaded[0]
    return NativeWire(*built) if built is not None else PyWire()
