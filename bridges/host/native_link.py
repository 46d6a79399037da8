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
from array import array
from typing import Any

import zmq

from logjam.message import MessageBatch
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
long lj_splice(const unsigned char *raw, const uint32_t *raw_lens, int n,
               const char *common, size_t common_len,
               const char *field1, size_t field1_len, const int64_t *values1,
               const char *field2, size_t field2_len, const int64_t *values2,
               const char *key_prefix, size_t key_prefix_len, const int64_t *keys,
               unsigned char *out, size_t cap, uint32_t *lens, int64_t *stamps, int64_t created_default);
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

/* ---- splicing @metadata into events that are JSON objects (see mapping.py) ---- */

static size_t lj_put_i64(unsigned char *o, int64_t v)
{
    char tmp[24];
    size_t n = 0, k = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do { tmp[n++] = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) o[k++] = '-';
    while (n) o[k++] = (unsigned char)tmp[--n];
    return k;
}

static int lj_digits(const unsigned char *p, int n, int *v)
{
    int i, x = 0;
    for (i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        x = x * 10 + (p[i] - '0');
    }
    *v = x;
    return 1;
}

static int64_t lj_days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* YYYY-MM-DDTHH:MM:SS[.f+][Z|+HH:MM|-HH:MM] as epoch ms; -1 for anything else (Python decides). */
static int64_t lj_iso_ms(const unsigned char *p, size_t n)
{
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int y, mo, d, h, mi, s, frac = 0, fd = 0, oh = 0, om = 0, sign = 0;
    size_t i = 19;
    if (n < 19 || p[4] != '-' || p[7] != '-' || p[10] != 'T' || p[13] != ':' || p[16] != ':') return -1;
    if (!lj_digits(p, 4, &y) || !lj_digits(p + 5, 2, &mo) || !lj_digits(p + 8, 2, &d) ||
        !lj_digits(p + 11, 2, &h) || !lj_digits(p + 14, 2, &mi) || !lj_digits(p + 17, 2, &s)) return -1;
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || h > 23 || mi > 59 || s > 59) return -1;
    if (d > mdays[mo - 1] + (mo == 2 && (y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)))) return -1;
    if (i < n && p[i] == '.') {
        i++;
        if (i >= n || p[i] < '0' || p[i] > '9') return -1;
        while (i < n && p[i] >= '0' && p[i] <= '9') {
            if (fd < 3) { frac = frac * 10 + (p[i] - '0'); fd++; }
            i++;
        }
        while (fd < 3) { frac *= 10; fd++; }
    }
    if (i < n) {
        if (p[i] == 'Z' && i + 1 == n) {
            i++;
        } else if ((p[i] == '+' || p[i] == '-') && i + 6 == n && p[i + 3] == ':') {
            sign = p[i] == '-' ? -1 : 1;
            if (!lj_digits(p + i + 1, 2, &oh) || !lj_digits(p + i + 4, 2, &om) || oh > 23 || om > 59) return -1;
            i = n;
        } else {
            return -1;
        }
    }
    int64_t ms = ((lj_days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s) * 1000 + frac)
                 - (int64_t)sign * (oh * 3600 + om * 60) * 1000;
    return ms > 0 ? ms : -1;
}

static int lj_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The top-level "@timestamp" of a valid JSON object: its ms, -2 when absent, -1 when Python must decide. */
static int64_t lj_find_ts(const unsigned char *p, size_t n)
{
    size_t i = 0;
    int depth = 0, expect_key = 0;
    while (i < n && lj_ws(p[i])) i++;
    if (i >= n || p[i] != '{') return -1;
    depth = 1; expect_key = 1; i++;
    while (i < n) {
        unsigned char c = p[i];
        if (c == '"') {
            size_t start = ++i;
            int escaped = 0;
            while (i < n && p[i] != '"') {
                if (p[i] == '\\') { escaped = 1; i++; }
                i++;
            }
            size_t end = i++;
            if (depth == 1 && expect_key) {
                expect_key = 0;
                if (escaped) return -1;
                if (end - start != 10 || memcmp(p + start, "@timestamp", 10) != 0) continue;
                while (i < n && (lj_ws(p[i]) || p[i] == ':')) i++;
                if (i >= n || p[i] != '"') return -1;
                start = ++i;
                while (i < n && p[i] != '"') { if (p[i] == '\\') return -1; i++; }
                return lj_iso_ms(p + start, i - start);
            }
            continue;
        }
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') depth--;
        else if (c == ',' && depth == 1) expect_key = 1;
        i++;
    }
    return -2;
}

long lj_splice(const unsigned char *raw, const uint32_t *raw_lens, int n,
               const char *common, size_t common_len,
               const char *field1, size_t field1_len, const int64_t *values1,
               const char *field2, size_t field2_len, const int64_t *values2,
               const char *key_prefix, size_t key_prefix_len, const int64_t *keys,
               unsigned char *out, size_t cap, uint32_t *lens, int64_t *stamps, int64_t created_default)
{
    static const char head[] = ",\"@metadata\":{";
    static const char idk[] = "\"_id\":\"";
    size_t in = 0, o = 0;
    int i;
    for (i = 0; i < n; i++) {
        const unsigned char *r = raw + in;
        size_t len = raw_lens[i], start = o;
        in += len;
        while (len && lj_ws(r[len - 1])) len--;
        if (len < 2 || r[len - 1] != '}') return -1 - i;
        if (o + len + common_len + field1_len + field2_len + key_prefix_len + 128 > cap) return -1 - n;
        stamps[i] = lj_find_ts(r, len);
        if (stamps[i] == -2) stamps[i] = created_default;
        memcpy(out + o, r, len - 1); o += len - 1;
        memcpy(out + o, head, sizeof head - 1); o += sizeof head - 1;
        memcpy(out + o, common, common_len); o += common_len;
        if (field1_len) {
            if (o > start && out[o - 1] != '{') out[o++] = ',';
            memcpy(out + o, field1, field1_len); o += field1_len;
            o += lj_put_i64(out + o, values1[i]);
        }
        if (field2_len) {
            if (out[o - 1] != '{') out[o++] = ',';
            memcpy(out + o, field2, field2_len); o += field2_len;
            o += lj_put_i64(out + o, values2[i]);
        }
        if (out[o - 1] != '{') out[o++] = ',';
        memcpy(out + o, idk, sizeof idk - 1); o += sizeof idk - 1;
        memcpy(out + o, key_prefix, key_prefix_len); o += key_prefix_len;
        o += lj_put_i64(out + o, keys[i]);
        out[o++] = '"'; out[o++] = '}'; out[o++] = '}';
        lens[i] = (uint32_t)(o - start);
    }
    return (long)o;
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

    def splice(self, raws: list[Any], common: bytes, field1: bytes, values1: Any, field2: bytes, values2: Any,
               key_prefix: bytes, keys: Any, created_default: int) -> tuple[bytes, Any, Any]:
        """`lj_splice`: (bodies joined, their lengths, created_ms: the @timestamp, `created_default`
        when there is none, or -1 where Python's parser must decide)."""
        n = len(raws)
        blob = b"".join(raws)
        raw_lens = array("I", map(len, raws))
        k = array("q", keys)
        v1 = array("q", values1) if field1 else k  # an absent field's column is never read
        v2 = array("q", values2) if field2 else k
        cap = len(blob) + n * (len(common) + len(field1) + len(field2) + len(key_prefix) + 128)
        out = self.ffi.new("unsigned char[]", cap)
        lens = array("I", bytes(4 * n))
        stamps = array("q", bytes(8 * n))
        ffi = self.ffi
        total = self.lib.lj_splice(
            ffi.from_buffer("unsigned char[]", blob), ffi.from_buffer("uint32_t[]", raw_lens), n,
            common, len(common), field1, len(field1), ffi.from_buffer("int64_t[]", v1),
            field2, len(field2), ffi.from_buffer("int64_t[]", v2),
            key_prefix, len(key_prefix), ffi.from_buffer("int64_t[]", k),
            out, cap, ffi.from_buffer("uint32_t[]", lens), ffi.from_buffer("int64_t[]", stamps), created_default,
        )
        if total < 0:
            raise ValueError(f"lj_splice refused event {-1 - total}: not a JSON object's text")
        return ffi.buffer(out, total)[:], lens, stamps

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


_loaded: list[Any] = []


def wire(native: bool = True) -> NativeWire | PyWire:
    """The C wire when it can be built (once per process), else the Python one."""
    if not native:
        return PyWire()
    if not _loaded:
        _loaded.append(load_module("_logjam_link_native", CDEF, SOURCE, log))
    built = _loaded[0]
    return NativeWire(*built) if built is not None else PyWire()
