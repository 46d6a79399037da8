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

The mapping's per-event JSON work is here too: `lj_splice_texts` validates each event's
text (accepting only what `orjson.loads` surely reads as a plain, non-empty object
without `@metadata`), splices its `@metadata` in and parses its `@timestamp`, for a
whole batch per call, so such an event is never parsed into Python objects
(`EventMapper.add_texts` in mapping.py).

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
# The most one event's @metadata adds beyond its texts (LJ_SPLICE_EXTRA in SOURCE).
SPLICE_EXTRA = 96

# Declared for cffi and defined in SOURCE with this one signature.
SPLICE_TEXTS = """long lj_splice_texts(const unsigned char *data, size_t data_len, const uint32_t *offs, const uint32_t *lens,
                     int start, int n, const char *common, size_t common_len,
                     const char *field1, size_t field1_len, const void *values1, int wide1,
                     const char *field2, size_t field2_len, const void *values2, int wide2,
                     const char *key_prefix, size_t key_prefix_len, const void *keys, int wide_keys, int64_t key_base,
                     unsigned char *out, size_t cap, uint32_t *out_lens, int64_t *stamps,
                     int64_t created_default, size_t *out_used)"""

# lj_string's table: 1 for the bytes that need no further look inside a JSON string.
_PLAIN = ",".join("1" if 0x20 <= c < 0x80 and c not in b'"\\' else "0" for c in range(256))

CDEF = """
int lj_link_send(void *sock, const char *app, size_t app_len, const char *topic, size_t topic_len,
                 const unsigned char *blob, const uint32_t *lens, const int64_t *created,
                 int start, int n, unsigned int compression, int *err);
int lj_link_drain(void *sock, unsigned char *status, int max, int *nbad, int *err);
long lj_count(void *sock, long want);
""" + SPLICE_TEXTS + """;
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

/* ---- validating an event: accept only text orjson.loads surely reads as a plain object ----
 * Anything these functions are unsure of is declined (they return 0) and Python maps
 * that event itself, so declining is always correct, only slower. A position past a
 * token is never 0, which is why 0 can mean "declined".
 */

#define LJ_MAX_DEPTH 128 /* orjson allows 1023 levels; deeper events are rare enough for Python */

/* Bytes that stand for themselves in a JSON string: printable ASCII (DEL too) but '"' and '\'. */
static const unsigned char lj_plain[256] = {""" + _PLAIN + r"""};

#define LJ_ONES 0x0101010101010101ULL
#define LJ_HIGH 0x8080808080808080ULL

/* Whether all eight bytes at p are lj_plain, tested at once: most of an event is string
   text, and this is where the validator spends its time. Over a word, (v - 0x01..01) & ~v
   & 0x80..80 is non-zero exactly when some byte of v is 0 (a borrow may mark bytes above
   that one too, never any when no byte is 0); likewise (x - 0x20..20) & ~x for a byte
   below 0x20. x ^ '"' and x ^ '\' are 0 at a quote or backslash, and x's own high bits
   mark non-ASCII bytes. */
static int lj_plain8(const unsigned char *p)
{
    uint64_t x, q, b;
    memcpy(&x, p, 8);
    q = x ^ (LJ_ONES * '"');
    b = x ^ (LJ_ONES * '\\');
    return !((x | ((x - LJ_ONES * 0x20) & ~x) | ((q - LJ_ONES) & ~q) | ((b - LJ_ONES) & ~b)) & LJ_HIGH);
}

static size_t lj_skip_ws(const unsigned char *p, size_t i, size_t n)
{
    while (i < n && lj_ws(p[i])) i++;
    return i;
}

static int lj_hex(unsigned char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The length of the UTF-8 sequence at p (p[0] >= 0x80), or 0: orjson refuses overlong
   forms, encoded surrogates (ED A0..BF) and anything above U+10FFFF. */
static size_t lj_utf8(const unsigned char *p, size_t avail)
{
    unsigned char c = p[0], lo = 0x80, hi = 0xBF;
    size_t len, k;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        else if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (avail < len || p[1] < lo || p[1] > hi) return 0;
    for (k = 2; k < len; k++)
        if (p[k] < 0x80 || p[k] > 0xBF) return 0;
    return len;
}

/* The string whose opening quote is p[i]: the position after its closing quote, or 0.
   *escaped is set when it holds a backslash escape. */
static size_t lj_string(const unsigned char *p, size_t i, size_t n, int *escaped)
{
    i++;
    for (;;) {
        unsigned char c;
        while (n - i >= 8 && lj_plain8(p + i)) i += 8;
        while (i < n && lj_plain[p[i]]) i++;
        if (i >= n) return 0;
        c = p[i];
        if (c == '"') return i + 1;
        if (c == '\\') {
            *escaped = 1;
            if (i + 1 >= n) return 0;
            c = p[i + 1];
            if (c == 'u') {
                unsigned v = 0;
                size_t k;
                int h;
                if (n - i < 6) return 0;
                for (k = 2; k < 6; k++) {
                    if ((h = lj_hex(p[i + k])) < 0) return 0;
                    v = v * 16 + (unsigned)h;
                }
                /* orjson refuses a lone surrogate; a pair is rare enough to leave to Python too. */
                if (v >= 0xD800 && v <= 0xDFFF) return 0;
                i += 6;
            } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
                i += 2;
            } else {
                return 0;
            }
        } else if (c < 0x20) {
            return 0; /* a raw control character: orjson refuses it */
        } else {
            size_t k = lj_utf8(p + i, n - i);
            if (!k) return 0;
            i += k;
        }
    }
}

static int lj_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)? starting at p[i]: the position after it, or 0.
   At most 19 integer digits and 2 exponent digits: such a number never overflows a double,
   which orjson refuses (it reads longer integers too, but Python can decide those). */
static size_t lj_number(const unsigned char *p, size_t i, size_t n)
{
    size_t d;
    if (i < n && p[i] == '-') i++;
    if (i >= n) return 0;
    if (p[i] == '0') {
        i++;
    } else if (p[i] >= '1' && p[i] <= '9') {
        d = i;
        while (i < n && lj_digit(p[i])) i++;
        if (i - d > 19) return 0;
    } else {
        return 0;
    }
    if (i < n && p[i] == '.') {
        d = ++i;
        while (i < n && lj_digit(p[i])) i++;
        if (i == d) return 0;
    }
    if (i < n && (p[i] == 'e' || p[i] == 'E')) {
        i++;
        if (i < n && (p[i] == '+' || p[i] == '-')) i++;
        d = i;
        while (i < n && lj_digit(p[i])) i++;
        if (i == d || i - d > 2) return 0;
    }
    return i;
}

static size_t lj_value(const unsigned char *p, size_t i, size_t n, int depth);

/* The object or array opening at p[i], inside `depth` others: the position after it, or 0. */
static size_t lj_container(const unsigned char *p, size_t i, size_t n, int depth)
{
    int object = p[i] == '{';
    unsigned char close = object ? '}' : ']';
    if (depth >= LJ_MAX_DEPTH) return 0;
    i = lj_skip_ws(p, i + 1, n);
    if (i < n && p[i] == close) return i + 1;
    for (;;) {
        if (object) {
            int escaped = 0;
            if (i >= n || p[i] != '"' || !(i = lj_string(p, i, n, &escaped))) return 0;
            i = lj_skip_ws(p, i, n);
            if (i >= n || p[i] != ':') return 0;
            i = lj_skip_ws(p, i + 1, n);
        }
        if (!(i = lj_value(p, i, n, depth + 1))) return 0;
        i = lj_skip_ws(p, i, n);
        if (i >= n) return 0;
        if (p[i] == close) return i + 1;
        if (p[i] != ',') return 0;
        i = lj_skip_ws(p, i + 1, n);
    }
}

static size_t lj_literal(const unsigned char *p, size_t i, size_t n, const char *word, size_t len)
{
    return n - i >= len && memcmp(p + i, word, len) == 0 ? i + len : 0;
}

/* Any JSON value starting at p[i] (no whitespace before it): the position after it, or 0. */
static size_t lj_value(const unsigned char *p, size_t i, size_t n, int depth)
{
    int escaped = 0;
    if (i >= n) return 0;
    switch (p[i]) {
    case '{':
    case '[': return lj_container(p, i, n, depth);
    case '"': return lj_string(p, i, n, &escaped);
    case 't': return lj_literal(p, i, n, "true", 4);
    case 'f': return lj_literal(p, i, n, "false", 5);
    case 'n': return lj_literal(p, i, n, "null", 4);
    default: return lj_number(p, i, n);
    }
}

/* Event text p[0:n]: 1 when it is surely a non-empty JSON object without a top-level
   "@metadata", with *close at its closing brace and *stamp its created_ms (the top-level
   "@timestamp" in the common ISO form, `created_default` without one, -1 when Python's
   parser must decide); else 0. */
static int lj_event(const unsigned char *p, size_t n, size_t *close, int64_t *stamp, int64_t created_default)
{
    size_t i = lj_skip_ws(p, 0, n), ts = 0, ts_end = 0;
    int ts_count = 0;
    if (i >= n || p[i] != '{') return 0; /* also a UTF-8 BOM, which orjson refuses */
    i = lj_skip_ws(p, i + 1, n);
    if (i < n && p[i] == '}') return 0; /* {} is mapped differently (no body to splice into) */
    for (;;) {
        size_t key = i + 1, value;
        int escaped = 0, is_ts;
        if (i >= n || p[i] != '"' || !(i = lj_string(p, i, n, &escaped))) return 0;
        /* An escaped key could spell @metadata or @timestamp: Python decides. */
        if (escaped) return 0;
        if (i - 1 - key == 9 && memcmp(p + key, "@metadata", 9) == 0) return 0;
        is_ts = i - 1 - key == 10 && memcmp(p + key, "@timestamp", 10) == 0;
        i = lj_skip_ws(p, i, n);
        if (i >= n || p[i] != ':') return 0;
        value = i = lj_skip_ws(p, i + 1, n);
        if (!(i = lj_value(p, i, n, 1))) return 0;
        if (is_ts) {
            ts_count++;
            ts = value;
            ts_end = i;
        }
        i = lj_skip_ws(p, i, n);
        if (i >= n) return 0;
        if (p[i] == '}') break;
        if (p[i] != ',') return 0;
        i = lj_skip_ws(p, i + 1, n);
    }
    if (lj_skip_ws(p, i + 1, n) != n) return 0;
    *close = i;
    if (ts_count == 0) {
        *stamp = created_default;
    } else if (ts_count > 1 || p[ts] != '"' || memchr(p + ts, '\\', ts_end - ts)) {
        *stamp = -1; /* a repeated key (orjson keeps the last), not a string, or escaped */
    } else {
        *stamp = lj_iso_ms(p + ts + 1, ts_end - ts - 2);
    }
    return 1;
}

/* Element i of a number column: int64_t when `wide`, else uint32_t (Lumberjack's sequence
   numbers come as array('I'); widening them in Python would cost more than the splice). */
static int64_t lj_column(const void *column, int wide, int i)
{
    return wide ? ((const int64_t *)column)[i] : (int64_t)((const uint32_t *)column)[i];
}

/* The most one event's @metadata adds beyond its four texts: punctuation and three numbers. */
#define LJ_SPLICE_EXTRA """ + str(SPLICE_EXTRA) + r"""

/* Events [start, n) of `data` (event i is data[offs[i] : offs[i] + lens[i]]) with
   ,"@metadata":{common,field1 values1[i],field2 values2[i],"_id":"key_prefix keys[i]"}
   spliced in before their closing brace, written one after another into `out`; the
   client's text is otherwise kept (whitespace after the brace dropped, as Python's
   rstrip does). The number columns are int64_t, or uint32_t where their `wide` is 0;
   keys may be NULL: event i's key is then key_base + i. Writes out_lens[i]
   and stamps[i] (see lj_event) and *out_used; stops at the first event lj_event declines.
   Returns how many events it spliced, or -1 when the caller's columns or `cap` are wrong. */
""" + SPLICE_TEXTS + r"""
{
    static const char head[] = ",\"@metadata\":{";
    static const char idk[] = "\"_id\":\"";
    size_t o = 0, extra = common_len + field1_len + field2_len + key_prefix_len + LJ_SPLICE_EXTRA;
    int i;
    *out_used = 0;
    for (i = start; i < n; i++) {
        const unsigned char *r;
        size_t begin = o, close;
        if ((uint64_t)offs[i] + lens[i] > data_len) return -1;
        r = data + offs[i];
        if (!lj_event(r, lens[i], &close, &stamps[i], created_default)) break;
        if (o + close + extra > cap) return -1;
        memcpy(out + o, r, close); o += close;
        memcpy(out + o, head, sizeof head - 1); o += sizeof head - 1;
        memcpy(out + o, common, common_len); o += common_len;
        if (field1_len) {
            if (out[o - 1] != '{') out[o++] = ',';
            memcpy(out + o, field1, field1_len); o += field1_len;
            o += lj_put_i64(out + o, lj_column(values1, wide1, i));
        }
        if (field2_len) {
            if (out[o - 1] != '{') out[o++] = ',';
            memcpy(out + o, field2, field2_len); o += field2_len;
            o += lj_put_i64(out + o, lj_column(values2, wide2, i));
        }
        if (out[o - 1] != '{') out[o++] = ',';
        memcpy(out + o, idk, sizeof idk - 1); o += sizeof idk - 1;
        memcpy(out + o, key_prefix, key_prefix_len); o += key_prefix_len;
        o += lj_put_i64(out + o, keys ? lj_column(keys, wide_keys, i) : key_base + i);
        out[o++] = '"'; out[o++] = '}'; out[o++] = '}';
        out_lens[i] = (uint32_t)(o - begin);
    }
    *out_used = o;
    return i - start;
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
        self._used = ffi.new("size_t *")
        self._scratch = ffi.new("unsigned char[]", 1 << 16)

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

    def text_splice(self, data: bytes, offsets: Any, lengths: Any, common: bytes, field1: bytes, values1: Any,
                    field2: bytes, values2: Any, key_prefix: bytes, keys: Any, created_default: int) -> "TextSplice":
        """A batch of event texts ready for `lj_splice_texts`; see `TextSplice`."""
        return TextSplice(self, data, offsets, lengths, common, field1, values1, field2, values2, key_prefix, keys,
                          created_default)

    def scratch(self, size: int) -> Any:
        """A C buffer of at least `size` bytes, kept and reused: a fresh large one costs page faults each time."""
        if len(self._scratch) < size:
            self._scratch = self.ffi.new("unsigned char[]", max(size, 2 * len(self._scratch)))
        return self._scratch

    def count(self, sock: zmq.Socket, want: int) -> int:
        """Receive and count whole messages until `want`, or until RCVTIMEO passes without one."""
        return self.lib.lj_count(self.ffi.cast("void *", sock.underlying), want)


def _column(values: Any, typecodes: str) -> array:
    """`values` as an array the C code can read in place: kept when it already is one of
    `typecodes`, else copied into an array of the last of them."""
    return values if values.__class__ is array and values.typecode in typecodes else array(typecodes[-1], values)


def _numbers(values: Any) -> array | None:
    """A number column for `lj_column`: an array('I') or array('q') as it is, anything else as array('q')."""
    return None if values is None else _column(values, "Iq")


class TextSplice:
    """One batch of event texts for `lj_splice_texts`: its columns as C buffers, built once,
    then `run(start)` from event to event (C stops at each event it declines)."""

    __slots__ = ("wire", "n", "created_default", "out_lens", "stamps", "_keep", "_args", "_outs", "_cap")

    def __init__(self, wire: NativeWire, data: bytes, offsets: Any, lengths: Any, common: bytes, field1: bytes,
                 values1: Any, field2: bytes, values2: Any, key_prefix: bytes, keys: Any, created_default: int) -> None:
        ffi = wire.ffi
        offs, lens = _column(offsets, "I"), _column(lengths, "I")
        n = len(lens)
        if len(offs) < n:
            raise ValueError(f"{len(offs)} offsets for {n} events")
        # An absent field's column, and keys=None (C then numbers from key_base), are never read.
        v1 = _numbers(values1) if field1 else None
        v2 = _numbers(values2) if field2 else None
        k = _numbers(keys)
        self.wire = wire
        self.n = n
        self.created_default = created_default
        self.out_lens = array("I", bytes(4 * n))
        self.stamps = array("q", bytes(8 * n))
        self._keep = (data, offs, lens, v1, v2, k)  # alive as long as C may read them
        self._cap = sum(lens) + n * (len(common) + len(field1) + len(field2) + len(key_prefix) + SPLICE_EXTRA)

        def numbers(column: array | None) -> tuple[Any, int]:
            """(the column's C buffer, whether it is int64_t)."""
            if column is None:
                return ffi.NULL, 1
            return ffi.from_buffer("char[]", column), int(column.typecode == "q")

        self._args = (ffi.from_buffer("unsigned char[]", data), len(data), ffi.from_buffer("uint32_t[]", offs),
                      ffi.from_buffer("uint32_t[]", lens), common, len(common), field1, len(field1), *numbers(v1),
                      field2, len(field2), *numbers(v2), key_prefix, len(key_prefix), *numbers(k))
        self._outs = (ffi.from_buffer("uint32_t[]", self.out_lens), ffi.from_buffer("int64_t[]", self.stamps))

    def run(self, start: int, key_base: int = 0) -> tuple[bytes, array, array, int]:
        """Splice events from `start` on until one is declined: (their bodies joined, their
        lengths, their created_ms (-1 where Python's parser must decide), how many).
        Without `keys`, event i's key is `key_base + i`."""
        w = self.wire
        out = w.scratch(self._cap)
        done = w.lib.lj_splice_texts(*self._args[:4], start, self.n, *self._args[4:], key_base, out, self._cap,
                                     *self._outs, self.created_default, w._used)
        if done < 0:
            raise ValueError("lj_splice_texts: an event lies outside the data, or the output buffer is too small")
        blob = w.ffi.buffer(out, w._used[0])[:]
        if start == 0 and done == self.n:
            return blob, self.out_lens, self.stamps, done
        return blob, self.out_lens[start:start + done], self.stamps[start:start + done], done


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
