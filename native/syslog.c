/* Parsing RFC 5424 syslog messages and writing their event bodies, a run in one call.
 *
 * Why: parsing each message into a dict in Python and encoding it with orjson was about
 * half of the syslog bridge's CPU per event (docs/protocols/syslog.md, "Speed"). This
 * writes, for each message of a run, the bytes bridges/syslog/bridge.py's `map_run` writes
 * (`orjson.dumps` of parse.py's body without its closing brace, then the @metadata
 * template), byte for byte; tests/test_syslog_native.py compares the two.
 *
 * Only the common case is taken here: well-formed UTF-8, `<PRI>1 ` and a whole header,
 * a TIMESTAMP that is `-` or RFC 3339 as senders write it (YYYY-MM-DDTHH:MM:SS, 1 to 6
 * fraction digits, `Z` or +-HH:MM), and structured data that parses with no SD-ID or
 * PARAM-NAME repeated. Any other message (RFC 3164, no PRI, a header cut short, other
 * timestamps, invalid dates, broken SD) gets out_lens[i] = 0 and nothing written: the
 * Python parser, which handles everything, maps it. No libzmq here.
 *
 * lj_syslog_recv reads the datagrams waiting on a UDP socket with one recvmmsg, where
 * Python's recvfrom took a system call, a bytes object of 64 KiB and an address tuple each.
 */
#define _GNU_SOURCE  /* recvmmsg */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

#include "syslog.h"
#include "lj_json.h"

#define SD_MAX_IDS 32     /* more elements, or more params in one, than this: left to Python */
#define SD_MAX_PARAMS 64
#define FIXED_ROOM 512    /* the body's own keys and numbers, beside the escaped text */

typedef struct { const uint8_t *p; size_t n; } span;

/* 1 for the bytes orjson writes escaped in a string: `"`, `\` and C0 controls. */
static const uint8_t ESCAPED[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,
};

static uint8_t *put(uint8_t *o, const void *s, size_t n)
{
    memcpy(o, s, n);
    return o + n;
}

#define PUT(o, lit) put((o), (lit), sizeof(lit) - 1)

/* Well-formed UTF-8 as a JSON string's inside, as orjson writes it: non-ASCII as is. */
static uint8_t *esc(uint8_t *o, const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        while (run < n && !ESCAPED[s[run]]) run++;
        o = put(o, s + i, run - i);
        if (run == n) break;
        o = lj_json_escape(o, s[run]);
        i = run + 1;
    }
    return o;
}

static uint8_t *str(uint8_t *o, span s)
{
    *o++ = '"';
    o = esc(o, s.p, s.n);
    *o++ = '"';
    return o;
}

/* An SD value with its three escapes (\" \\ \]) undone, as a JSON string; a backslash
   before anything else stays, as parse.py's _SD_ESCAPE leaves it. */
static uint8_t *sd_value(uint8_t *o, span v)
{
    *o++ = '"';
    for (size_t i = 0; i < v.n; i++) {
        uint8_t c = v.p[i];
        if (c == '\\' && i + 1 < v.n && (v.p[i + 1] == '"' || v.p[i + 1] == '\\' || v.p[i + 1] == ']'))
            c = v.p[++i];
        if (ESCAPED[c])
            o = lj_json_escape(o, c);
        else
            *o++ = c;
    }
    *o++ = '"';
    return o;
}

static uint8_t *num(uint8_t *o, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    if (v < 0) *o++ = '-';
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (n) *o++ = (uint8_t)tmp[--n];
    return o;
}

static int utf8_ok(const uint8_t *s, size_t n)
{
    const uint8_t *p = s, *end = s + n;
    while (p < end) {
        if (*p < 0x80) { p++; continue; }
        size_t k = lj_utf8_len(p, end);
        if (k == 0) return 0;
        p += k;
    }
    return 1;
}

static int digits(const uint8_t *p, size_t n, int *out)
{
    int v = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        v = v * 10 + (p[i] - '0');
    }
    *out = v;
    return 1;
}

/* Days from 1970-01-01 to y-m-d in the proleptic Gregorian calendar (March-based years, so
   that the leap day ends a year). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* An RFC 3339 TIMESTAMP of the form above as epoch ms (0 for 1970 or before), as parse.py's
   fromisoformat and epoch_ms read it; -1 for any other text (Python decides about it). */
static int timestamp_ms(const uint8_t *t, size_t n, int64_t *ms)
{
    int y, mo, d, h, mi, s, oh = 0, om = 0;
    if (n < 20 || t[4] != '-' || t[7] != '-' || t[10] != 'T' || t[13] != ':' || t[16] != ':') return -1;
    if (!digits(t, 4, &y) || !digits(t + 5, 2, &mo) || !digits(t + 8, 2, &d) || !digits(t + 11, 2, &h)
        || !digits(t + 14, 2, &mi) || !digits(t + 17, 2, &s))
        return -1;
    size_t i = 19;
    int64_t us = 0;
    if (t[i] == '.') {
        size_t start = ++i;
        while (i < n && t[i] >= '0' && t[i] <= '9') us = us * 10 + (t[i++] - '0');
        if (i == start || i - start > 6) return -1;
        for (size_t k = i - start; k < 6; k++) us *= 10;
    }
    int sign = 0;
    if (i + 1 == n && t[i] == 'Z') {
        sign = 0;
    } else if (i + 6 == n && (t[i] == '+' || t[i] == '-') && t[i + 3] == ':' && digits(t + i + 1, 2, &oh)
               && digits(t + i + 4, 2, &om)) {
        sign = t[i] == '+' ? 1 : -1;
    } else {
        return -1;
    }
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (y < 1 || mo < 1 || mo > 12 || h > 23 || mi > 59 || s > 59 || oh > 23 || om > 59 || d < 1) return -1;
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (d > mdays[mo - 1] + (mo == 2 && leap)) return -1;
    int64_t secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s - sign * (oh * 3600 + om * 60);
    int64_t total = secs * 1000000 + us;
    *ms = total > 0 ? total / 1000 : 0;
    return 0;
}

static int same(span a, span b)
{
    return a.n == b.n && memcmp(a.p, b.p, a.n) == 0;
}

/* The structured data at the start of sd[0:n] (which begins with `[`), read as parse.py's
   structured_data reads it: its length, or -1 when Python must decide (not SD, or an SD-ID
   or PARAM-NAME repeated, which Python merges). `o`, when not NULL, gets its JSON object. */
static long structured(const uint8_t *sd, size_t n, uint8_t **o)
{
    span ids[SD_MAX_IDS];
    int nid = 0;
    size_t i = 0;
    uint8_t *w = o ? *o : NULL;
    if (w) *w++ = '{';
    while (i < n && sd[i] == '[') {
        size_t e = i + 1;
        while (e < n && sd[e] != ' ' && sd[e] != ']') e++;  /* SD-ID ends at SP or `]` */
        if (e >= n || e == i + 1 || nid == SD_MAX_IDS) return -1;
        span id = {sd + i + 1, e - i - 1};
        for (int k = 0; k < nid; k++)
            if (same(ids[k], id)) return -1;
        ids[nid++] = id;
        if (w) {
            if (nid > 1) *w++ = ',';
            w = str(w, id);
            w = PUT(w, ":{");
        }
        span names[SD_MAX_PARAMS];
        int nn = 0;
        i = e;
        /* ` NAME="VALUE"`: NAME up to the first `=`, VALUE up to the first `"` no backslash escapes. */
        while (i < n && sd[i] == ' ') {
            size_t eq = i + 1;
            while (eq < n && sd[eq] != '=') eq++;
            if (eq + 1 >= n || sd[eq + 1] != '"') break;
            size_t v = eq + 2;
            while (v < n && sd[v] != '"') v += sd[v] == '\\' ? 2 : 1;
            if (v >= n) break;
            span name = {sd + i + 1, eq - i - 1};
            if (nn == SD_MAX_PARAMS) return -1;
            for (int k = 0; k < nn; k++)
                if (same(names[k], name)) return -1;
            names[nn++] = name;
            if (w) {
                if (nn > 1) *w++ = ',';
                w = str(w, name);
                *w++ = ':';
                w = sd_value(w, (span){sd + eq + 2, v - eq - 2});
            }
            i = v + 1;
        }
        if (i >= n || sd[i] != ']') return -1;
        if (w) *w++ = '}';
        i++;
    }
    if (w) {
        *w++ = '}';
        *o = w;
    }
    return (long)i;
}

/* One message's body without its closing brace at o; NULL when Python must map it. */
static uint8_t *body(const uint8_t *s, size_t n, uint8_t *o, int64_t *ms)
{
    if (n == 0 || s[0] != '<') return NULL;
    size_t gt = 1;
    while (gt < 5 && gt < n && s[gt] != '>') gt++;
    int pri;
    if (gt >= 5 || gt >= n || gt == 1 || !digits(s + 1, gt - 1, &pri) || pri > 191) return NULL;
    if (n < gt + 3 || s[gt + 1] != '1' || s[gt + 2] != ' ') return NULL;
    span f[5];  /* TIMESTAMP HOSTNAME APP-NAME PROCID MSGID, each up to the next SP */
    size_t at = gt + 3;
    for (int k = 0; k < 5; k++) {
        const uint8_t *sp = memchr(s + at, ' ', n - at);
        if (sp == NULL) return NULL;  /* a header cut short */
        f[k] = (span){s + at, (size_t)(sp - s) - at};
        at = (size_t)(sp - s) + 1;
    }
    span msg = {s + at, n - at};
    int has_ts = !(f[0].n == 1 && f[0].p[0] == '-');
    *ms = 0;
    if (has_ts && timestamp_ms(f[0].p, f[0].n, ms) < 0) return NULL;
    long sd_len = -1;
    if (msg.n && msg.p[0] == '-') {
        size_t cut = msg.n > 1 && msg.p[1] == ' ' ? 2 : 1;
        msg.p += cut;
        msg.n -= cut;
    } else if (msg.n && msg.p[0] == '[') {
        sd_len = structured(msg.p, msg.n, NULL);
        if (sd_len < 0) return NULL;
    }
    span text = msg;
    if (sd_len >= 0) {
        text.p += sd_len;
        text.n -= (size_t)sd_len;
        if (text.n && text.p[0] == ' ') text.p++, text.n--;
    }
    if (text.n >= 3 && text.p[0] == 0xEF && text.p[1] == 0xBB && text.p[2] == 0xBF) text.p += 3, text.n -= 3;
    o = PUT(o, "{\"message\":");
    o = str(o, text);
    o = PUT(o, ",\"syslog\":{\"format\":\"rfc5424\",\"priority\":");
    o = num(o, pri);
    o = PUT(o, ",\"facility\":");
    o = num(o, pri >> 3);
    o = PUT(o, ",\"severity\":");
    o = num(o, pri & 7);
    o = PUT(o, ",\"version\":1");
    static const char *const names[] = {",\"timestamp\":", ",\"hostname\":", ",\"app_name\":", ",\"procid\":",
                                        ",\"msgid\":"};
    for (int k = 0; k < 5; k++) {
        if (f[k].n == 1 && f[k].p[0] == '-') continue;
        o = put(o, names[k], strlen(names[k]));
        o = str(o, f[k]);
    }
    if (sd_len >= 0) {
        o = PUT(o, ",\"structured_data\":");
        structured(msg.p, msg.n, &o);
    }
    *o++ = '}';
    o = PUT(o, ",\"raw\":");
    o = str(o, (span){s, n});
    if (has_ts) {
        o = PUT(o, ",\"@timestamp\":");
        o = str(o, f[0]);
    }
    return o;
}

/* Each of the n messages (back to back at `in`, lens[i] bytes each) as map_run writes it:
   its body, then pre, [txnrs[i], mid,] key + i, post. out_lens[i] is its length, or 0 when
   Python must map it (nothing written); stamps[i] its time (received_ms without one).
   Returns the bytes written; cap is checked before each message. */
size_t lj_syslog_map(const uint8_t *in, const uint32_t *lens, size_t n, const uint8_t *pre, size_t pre_len,
                     const uint8_t *mid, size_t mid_len, const uint8_t *post, size_t post_len,
                     const int64_t *txnrs, int64_t key, int64_t received_ms, uint8_t *out, size_t cap,
                     uint32_t *out_lens, int64_t *stamps)
{
    uint8_t *o = out;
    size_t meta = pre_len + mid_len + post_len + 48;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *s = in;
        size_t len = lens[i];
        in += len;
        out_lens[i] = 0;
        stamps[i] = received_ms;
        /* Escaping grows a byte to 6 at most; the text is written twice (raw, and once split
           into the fields, SD and message) and the timestamp twice more. */
        if ((size_t)(out + cap - o) < 14 * len + FIXED_ROOM + meta || !utf8_ok(s, len)) continue;
        int64_t ms = 0;
        uint8_t *end = body(s, len, o, &ms);
        if (end == NULL) continue;
        end = put(end, pre, pre_len);
        if (txnrs != NULL) {
            end = num(end, txnrs[i]);
            end = put(end, mid, mid_len);
        }
        end = num(end, key + (int64_t)i);
        end = put(end, post, post_len);
        out_lens[i] = (uint32_t)(end - o);
        if (ms) stamps[i] = ms;
        o = end;
    }
    return (size_t)(o - out);
}

#define RECV_MAX 256

/* Up to n (at most RECV_MAX) datagrams waiting on fd, without blocking: datagram i at
   buf + i * slot (lens[i] bytes; a longer one is cut to slot), its sender's address at
   addrs + i * addr_room (addr_lens[i] bytes, or 0 when it is the sender of datagram i - 1).
   Returns how many, 0 when none waits, or -errno. */
int lj_syslog_recv(int fd, uint8_t *buf, uint32_t slot, uint32_t n, uint32_t *lens, uint8_t *addrs,
                   uint32_t addr_room, uint32_t *addr_lens)
{
    struct mmsghdr msgs[RECV_MAX];
    struct iovec iov[RECV_MAX];
    if (n > RECV_MAX) n = RECV_MAX;
    memset(msgs, 0, sizeof(struct mmsghdr) * n);
    for (uint32_t i = 0; i < n; i++) {
        iov[i].iov_base = buf + (size_t)i * slot;
        iov[i].iov_len = slot;
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = addrs + (size_t)i * addr_room;
        msgs[i].msg_hdr.msg_namelen = addr_room;
    }
    int got;
    do {
        got = recvmmsg(fd, msgs, n, MSG_DONTWAIT, NULL);
    } while (got < 0 && errno == EINTR);
    if (got < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
    for (int i = 0; i < got; i++) {
        lens[i] = msgs[i].msg_len;
        addr_lens[i] = msgs[i].msg_hdr.msg_namelen;
        /* 0: the same sender as the datagram before (a burst is mostly one sender's). */
        if (i > 0 && addr_lens[i] == msgs[i - 1].msg_hdr.msg_namelen
            && memcmp(addrs + (size_t)i * addr_room, addrs + (size_t)(i - 1) * addr_room, addr_lens[i]) == 0)
            addr_lens[i] = 0;
    }
    return got;
}
