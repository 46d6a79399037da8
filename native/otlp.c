/* OTLP log records from protobuf wire bytes straight to the bridge's JSON bodies.
 *
 * Why: reading a record out of upb's Python objects cost the bridge more than everything
 * else it does per record (a KeyValue and its AnyValue about 0.4 us each from Python;
 * docs/protocols/otlp.md, "Speed"). This reads the wire itself (varints, fixed-width and
 * length-delimited fields; no protobuf library) and writes each record's fields as the
 * JSON records.py writes for them, with orjson's escapes, then the scope's shared text
 * and the record's index. No libzmq here: this module is not bound to it.
 *
 * It reads only what it can read exactly as upb does, and declines the rest for the
 * Python path (records.py), which then answers as it always did: a key given twice in one
 * object, a singular message given twice (protobuf merges them), two members of
 * AnyValue's oneof in one value, a known field with another wire type, groups, nesting
 * deeper than MAX_DEPTH, a value out of its field's range, UTF-8 that is not well formed,
 * anything cut short. Finite doubles it does not format itself: it hands their values
 * back (LJ_OTLP_DOUBLES) and writes the text Python gives it (orjson's), so every byte
 * it writes is what records.py writes.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "lj_json.h"
#include "otlp.h"

#define MAX_DEPTH 16  /* nesting of arrays and key-value lists; deeper is declined */
#define MAX_KEYS 64   /* pairs in one attribute list or key-value list; more is declined */

/* Wire types. */
#define VARINT 0
#define I64 1
#define LEN 2
#define I32 5

#define TAG(field, type) (((uint32_t)(field) << 3) | (type))

typedef struct {
    const uint8_t *p;
    uint32_t n;
} span_t;

/* -- reading the wire ------------------------------------------------------------------ */

/* A varint at *pp (at most 10 bytes, none past 64 bits); -1 when there is none. */
static int varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p == end) return -1;
        uint8_t b = *p++;
        if (shift == 63 && b > 1) return -1;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* A field's tag at *pp: field number >= 1, and a wire type. */
static int tag(const uint8_t **pp, const uint8_t *end, uint32_t *out) {
    uint64_t t;
    if (**pp < 0x80) {  /* fields 1-15: one byte */
        t = *(*pp)++;
    } else if (varint(pp, end, &t) || t > UINT32_MAX) {
        return -1;
    }
    if ((t >> 3) == 0) return -1;
    *out = (uint32_t)t;
    return 0;
}

static uint64_t le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

static uint32_t le32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap32(v);
#endif
    return v;
}

/* A length-delimited field's bytes. */
static int len_field(const uint8_t **pp, const uint8_t *end, span_t *out) {
    uint64_t n;
    if (varint(pp, end, &n) || n > (uint64_t)(end - *pp)) return -1;
    out->p = *pp;
    out->n = (uint32_t)n;
    *pp += n;
    return 0;
}

/* A field's value read and dropped (an unknown field: upb keeps it aside, it changes nothing).
 * Groups are declined. */
static int skip(const uint8_t **pp, const uint8_t *end, uint32_t t) {
    uint64_t v;
    span_t s;
    switch (t & 7) {
    case VARINT: return varint(pp, end, &v);
    case I64: if (end - *pp < 8) return -1; *pp += 8; return 0;
    case LEN: return len_field(pp, end, &s);
    case I32: if (end - *pp < 4) return -1; *pp += 4; return 0;
    default: return -1;
    }
}

/* Whether UTF-8 is well formed (what upb checks for every proto3 string field). */
static int utf8_ok(const uint8_t *p, uint32_t n) {
    const uint8_t *end = p + n;
    while (p < end) {
        while (end - p >= 8) {
            uint64_t w;
            memcpy(&w, p, 8);
            if (w & 0x8080808080808080ULL) break;
            p += 8;
        }
        if (p == end) break;
        if (*p < 0x80) {
            p++;
            continue;
        }
        size_t k = lj_utf8_len(p, end);
        if (!k) return 0;
        p += k;
    }
    return 1;
}

/* A string field: its bytes, well-formed UTF-8. */
static int str_field(const uint8_t **pp, const uint8_t *end, span_t *out) {
    return len_field(pp, end, out) || !utf8_ok(out->p, out->n) ? -1 : 0;
}

/* -- writing JSON ---------------------------------------------------------------------- */

typedef struct {
    uint8_t *p, *end;
    lj_otlp_out *o;
    uint32_t doubles;  /* finite doubles met so far */
    int err;           /* an LJ_OTLP_* code once something failed */
} writer_t;

static int room(writer_t *w, size_t n) {
    if ((size_t)(w->end - w->p) >= n) return 1;
    if (!w->err) w->err = LJ_OTLP_ROOM;
    return 0;
}

static void put(writer_t *w, const void *s, size_t n) {
    if (room(w, n)) {
        memcpy(w->p, s, n);
        w->p += n;
    }
}

#define PUT_LIT(w, lit) put((w), (lit), sizeof(lit) - 1)

static void put_byte(writer_t *w, uint8_t c) {
    if (room(w, 1)) *w->p++ = c;
}

static const char HEX[] = "0123456789abcdef";

/* A JSON string, escaped as orjson escapes: `"` and `\`, and control characters (\b \t \n
 * \f \r by name, the rest as \u00xx); everything else as it is. */
static void put_str(writer_t *w, const uint8_t *s, uint32_t n) {
    if (!room(w, (size_t)n * 6 + 2)) return;
    uint8_t *p = w->p;
    *p++ = '"';
    for (uint32_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *p++ = c;
            continue;
        }
        *p++ = '\\';
        switch (c) {
        case '"': *p++ = '"'; break;
        case '\\': *p++ = '\\'; break;
        case '\b': *p++ = 'b'; break;
        case '\t': *p++ = 't'; break;
        case '\n': *p++ = 'n'; break;
        case '\f': *p++ = 'f'; break;
        case '\r': *p++ = 'r'; break;
        default:
            *p++ = 'u'; *p++ = '0'; *p++ = '0';
            *p++ = HEX[c >> 4]; *p++ = HEX[c & 15];
        }
    }
    *p++ = '"';
    w->p = p;
}

static void put_u64(writer_t *w, uint64_t v) {
    char tmp[20];
    int i = 20;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put(w, tmp + i, 20 - i);
}

static void put_i64(writer_t *w, int64_t v) {
    if (v < 0) {
        put_byte(w, '-');
        put_u64(w, (uint64_t)0 - (uint64_t)v);
    } else {
        put_u64(w, (uint64_t)v);
    }
}

/* Bytes as lowercase hex, in quotes (trace and span ids: `bytes.hex()`). */
static void put_hex(writer_t *w, span_t s) {
    if (!room(w, (size_t)s.n * 2 + 2)) return;
    uint8_t *p = w->p;
    *p++ = '"';
    for (uint32_t i = 0; i < s.n; i++) {
        *p++ = HEX[s.p[i] >> 4];
        *p++ = HEX[s.p[i] & 15];
    }
    *p++ = '"';
    w->p = p;
}

/* Bytes as standard base64 with padding, in quotes (`base64.b64encode`). */
static void put_base64(writer_t *w, span_t s) {
    static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if (!room(w, ((size_t)s.n + 2) / 3 * 4 + 2)) return;
    uint8_t *p = w->p;
    const uint8_t *q = s.p;
    uint32_t n = s.n;
    *p++ = '"';
    for (; n >= 3; n -= 3, q += 3) {
        uint32_t v = ((uint32_t)q[0] << 16) | ((uint32_t)q[1] << 8) | q[2];
        *p++ = B64[v >> 18]; *p++ = B64[(v >> 12) & 63]; *p++ = B64[(v >> 6) & 63]; *p++ = B64[v & 63];
    }
    if (n) {
        uint32_t v = (uint32_t)q[0] << 16 | (n == 2 ? (uint32_t)q[1] << 8 : 0);
        *p++ = B64[v >> 18]; *p++ = B64[(v >> 12) & 63];
        *p++ = n == 2 ? B64[(v >> 6) & 63] : '=';
        *p++ = '=';
    }
    *p++ = '"';
    w->p = p;
}

/* A double as values.any_value gives it: non-finite as its Python name ("inf", "-inf",
 * "nan"), finite as orjson writes it, from the text Python gave (or noted for Python). */
static void put_double(writer_t *w, double d) {
    if (isnan(d)) {
        PUT_LIT(w, "\"nan\"");
        return;
    }
    if (isinf(d)) {
        if (d > 0) PUT_LIT(w, "\"inf\"");
        else PUT_LIT(w, "\"-inf\"");
        return;
    }
    lj_otlp_out *o = w->o;
    uint32_t i = w->doubles++;
    if (o->doubles_given) {
        if (i >= o->doubles_given) {  /* not the doubles of the first call: cannot happen */
            w->err = LJ_OTLP_DECLINE;
            return;
        }
        uint32_t start = i ? o->doubles_ends[i - 1] : 0;
        put(w, o->doubles_text + start, o->doubles_ends[i] - start);
    } else {
        if (i < o->doubles_cap) o->doubles[i] = d;
        put(w, "0", 1);  /* a stand-in: this call ends in LJ_OTLP_DOUBLES */
    }
}

/* -- AnyValue, KeyValue ---------------------------------------------------------------- */

enum { K_NONE = 0, K_STRING, K_BOOL, K_INT, K_DOUBLE, K_ARRAY, K_KVLIST, K_BYTES, K_STRINDEX };

/* An AnyValue, read: which member of its oneof it holds (K_NONE: none) and the member. */
typedef struct {
    int kind;
    uint64_t u;  /* bool, int, double (bits) */
    span_t s;    /* string, bytes, array, kvlist */
} any_t;

static int read_any(const uint8_t *p, const uint8_t *end, any_t *a) {
    a->kind = K_NONE;
    while (p < end) {
        uint32_t t;
        if (tag(&p, end, &t)) return -1;
        uint32_t field = t >> 3;
        int kind;
        switch (t) {
        case TAG(1, LEN): kind = K_STRING; if (str_field(&p, end, &a->s)) return -1; break;
        case TAG(2, VARINT): kind = K_BOOL; if (varint(&p, end, &a->u) || a->u > 1) return -1; break;
        case TAG(3, VARINT): kind = K_INT; if (varint(&p, end, &a->u)) return -1; break;
        case TAG(4, I64):
            kind = K_DOUBLE;
            if (end - p < 8) return -1;
            a->u = le64(p);
            p += 8;
            break;
        case TAG(5, LEN): kind = K_ARRAY; if (len_field(&p, end, &a->s)) return -1; break;
        case TAG(6, LEN): kind = K_KVLIST; if (len_field(&p, end, &a->s)) return -1; break;
        case TAG(7, LEN): kind = K_BYTES; if (len_field(&p, end, &a->s)) return -1; break;
        case TAG(8, VARINT): kind = K_STRINDEX; if (varint(&p, end, &a->u)) return -1; break;
        default:
            if (field <= 8 || skip(&p, end, t)) return -1;  /* a member with another wire type */
            continue;
        }
        if (a->kind != K_NONE) return -1;  /* a second member (protobuf: the last, or merged) */
        a->kind = kind;
    }
    return 0;
}

static void put_value(writer_t *w, const any_t *a, int depth);

/* KeyValue pairs (the repeated field `field` of the message at [p, end)) as one JSON object;
 * a key given twice is declined (Python's dict keeps its first place and last value). */
static void put_object(writer_t *w, const uint8_t *p, const uint8_t *end, uint32_t field, int depth) {
    span_t keys[MAX_KEYS];
    int n = 0;
    put_byte(w, '{');
    while (p < end && !w->err) {
        uint32_t t;
        span_t kv;
        if (tag(&p, end, &t)) goto bad;
        if (t != TAG(field, LEN)) {
            if ((t >> 3) == field || skip(&p, end, t)) goto bad;
            continue;
        }
        if (len_field(&p, end, &kv)) goto bad;
        /* KeyValue: key (1), value (2), key_strindex (3, not mapped). */
        span_t key = {kv.p, 0}, value = {NULL, 0};
        const uint8_t *q = kv.p, *qend = kv.p + kv.n;
        while (q < qend) {
            uint32_t kt;
            uint64_t ignored;
            if (tag(&q, qend, &kt)) goto bad;
            if (kt == TAG(1, LEN)) {
                if (str_field(&q, qend, &key)) goto bad;
            } else if (kt == TAG(2, LEN)) {
                if (value.p || len_field(&q, qend, &value)) goto bad;  /* twice: merged */
            } else if (kt == TAG(3, VARINT)) {
                if (varint(&q, qend, &ignored)) goto bad;
            } else if ((kt >> 3) <= 3 || skip(&q, qend, kt)) {
                goto bad;
            }
        }
        if (n == MAX_KEYS) goto bad;
        for (int i = 0; i < n; i++)
            if (keys[i].n == key.n && memcmp(keys[i].p, key.p, key.n) == 0) goto bad;
        keys[n] = key;
        if (n++) put_byte(w, ',');
        put_str(w, key.p, key.n);
        put_byte(w, ':');
        any_t a = {K_NONE, 0, {NULL, 0}};
        if (value.p && read_any(value.p, value.p + value.n, &a)) goto bad;
        put_value(w, &a, depth);
    }
    put_byte(w, '}');
    return;
bad:
    w->err = LJ_OTLP_DECLINE;
}

/* An ArrayValue's values as a JSON array. */
static void put_array(writer_t *w, const uint8_t *p, const uint8_t *end, int depth) {
    int n = 0;
    put_byte(w, '[');
    while (p < end && !w->err) {
        uint32_t t;
        span_t v;
        any_t a;
        if (tag(&p, end, &t)) goto bad;
        if (t != TAG(1, LEN)) {
            if ((t >> 3) == 1 || skip(&p, end, t)) goto bad;
            continue;
        }
        if (len_field(&p, end, &v) || read_any(v.p, v.p + v.n, &a)) goto bad;
        if (n++) put_byte(w, ',');
        put_value(w, &a, depth);
    }
    put_byte(w, ']');
    return;
bad:
    w->err = LJ_OTLP_DECLINE;
}

/* An AnyValue as values.any_value gives it (K_NONE and K_STRINDEX: null). */
static void put_value(writer_t *w, const any_t *a, int depth) {
    switch (a->kind) {
    case K_STRING: put_str(w, a->s.p, a->s.n); return;
    case K_BOOL:
        if (a->u) PUT_LIT(w, "true");
        else PUT_LIT(w, "false");
        return;
    case K_INT: put_i64(w, (int64_t)a->u); return;
    case K_DOUBLE: {
        double d;
        memcpy(&d, &a->u, 8);
        put_double(w, d);
        return;
    }
    case K_ARRAY:
    case K_KVLIST:
        if (depth >= MAX_DEPTH) {
            w->err = LJ_OTLP_DECLINE;
            return;
        }
        if (a->kind == K_ARRAY) put_array(w, a->s.p, a->s.p + a->s.n, depth + 1);
        else put_object(w, a->s.p, a->s.p + a->s.n, 1, depth + 1);
        return;
    case K_BYTES: put_base64(w, a->s); return;
    default: PUT_LIT(w, "null"); return;
    }
}

/* -- LogRecord ------------------------------------------------------------------------- */

/* One record's body: `{`, its fields in records._head's order, its scope's shared text,
 * its index, the tail. */
static void put_record(writer_t *w, const uint8_t *p, const uint8_t *end, span_t shared, uint64_t index,
                       const uint8_t *tail, size_t tail_len, int64_t *created_ms) {
    const uint8_t *start = p;
    uint64_t time = 0, observed = 0, severity = 0, dropped = 0;
    uint32_t flags = 0, attributes = 0;
    span_t text = {NULL, 0}, event = {NULL, 0}, trace = {NULL, 0}, span = {NULL, 0}, body = {NULL, 0};
    while (p < end) {
        uint32_t t;
        if (tag(&p, end, &t)) goto bad;
        switch (t) {
        case TAG(1, I64):
            if (end - p < 8) goto bad;
            time = le64(p);
            p += 8;
            break;
        case TAG(11, I64):
            if (end - p < 8) goto bad;
            observed = le64(p);
            p += 8;
            break;
        case TAG(2, VARINT):  /* an open enum (int32): a negative one is declined */
            if (varint(&p, end, &severity) || severity > INT32_MAX) goto bad;
            break;
        case TAG(3, LEN): if (str_field(&p, end, &text)) goto bad; break;
        case TAG(5, LEN): if (body.p || len_field(&p, end, &body)) goto bad; break;  /* twice: merged */
        case TAG(6, LEN): {
            span_t kv;
            if (len_field(&p, end, &kv)) goto bad;
            attributes++;
            break;
        }
        case TAG(7, VARINT): if (varint(&p, end, &dropped) || dropped > UINT32_MAX) goto bad; break;
        case TAG(8, I32):
            if (end - p < 4) goto bad;
            flags = le32(p);
            p += 4;
            break;
        case TAG(9, LEN): if (len_field(&p, end, &trace)) goto bad; break;
        case TAG(10, LEN): if (len_field(&p, end, &span)) goto bad; break;
        case TAG(12, LEN): if (str_field(&p, end, &event)) goto bad; break;
        default:
            if ((t >> 3) <= 12 || skip(&p, end, t)) goto bad;  /* a known field with another wire type */
        }
    }
    uint8_t *first = w->p;
    put_byte(w, '{');
#define SEP() do { if (w->p != first + 1) put_byte(w, ','); } while (0)
    if (body.p) {
        any_t a;
        if (read_any(body.p, body.p + body.n, &a)) goto bad;
        if (a.kind == K_STRING) {
            PUT_LIT(w, "\"message\":");
            put_str(w, a.s.p, a.s.n);
        } else if (a.kind != K_NONE) {
            PUT_LIT(w, "\"body\":");
            put_value(w, &a, 0);
        }
    }
    if (text.n) {
        SEP();
        PUT_LIT(w, "\"severity_text\":");
        put_str(w, text.p, text.n);
    }
    if (severity) {
        SEP();
        PUT_LIT(w, "\"severity_number\":");
        put_u64(w, severity);
    }
    if (attributes) {
        SEP();
        PUT_LIT(w, "\"attributes\":");
        put_object(w, start, end, 6, 0);
    }
    if (dropped) {
        SEP();
        PUT_LIT(w, "\"dropped_attributes_count\":");
        put_u64(w, dropped);
    }
    if (event.n) {
        SEP();
        PUT_LIT(w, "\"event_name\":");
        put_str(w, event.p, event.n);
    }
    if (trace.n) {
        SEP();
        PUT_LIT(w, "\"trace_id\":");
        put_hex(w, trace);
    }
    if (span.n) {
        SEP();
        PUT_LIT(w, "\"span_id\":");
        put_hex(w, span);
    }
    if (flags) {
        SEP();
        PUT_LIT(w, "\"flags\":");
        put_u64(w, flags);
    }
    if (time) {
        SEP();
        PUT_LIT(w, "\"time_unix_nano\":");
        put_u64(w, time);
    }
    if (observed) {
        SEP();
        PUT_LIT(w, "\"observed_time_unix_nano\":");
        put_u64(w, observed);
    }
    SEP();
#undef SEP
    put(w, shared.p, shared.n);
    put_u64(w, index);
    put(w, tail, tail_len);
    *created_ms = (int64_t)((time ? time : observed) / 1000000);
    return;
bad:
    w->err = LJ_OTLP_DECLINE;
}

/* -- the request ----------------------------------------------------------------------- */

#define OFF(v) ((uint32_t)((v).p - base))

static int scan_scope(const uint8_t *base, span_t logs, lj_otlp_scope *s) {
    const uint8_t *p = logs.p, *end = logs.p + logs.n;
    memset(s, 0, sizeof *s);
    s->logs_off = OFF(logs);
    s->logs_len = logs.n;
    while (p < end) {
        uint32_t t;
        span_t v;
        if (tag(&p, end, &t)) return -1;
        switch (t) {
        case TAG(1, LEN):
            if (s->has_scope || len_field(&p, end, &v)) return -1;  /* twice: merged */
            s->has_scope = 1;
            s->scope_off = OFF(v);
            s->scope_len = v.n;
            break;
        case TAG(2, LEN):
            if (len_field(&p, end, &v)) return -1;
            s->records++;
            s->record_bytes += v.n;
            break;
        case TAG(3, LEN):
            if (str_field(&p, end, &v)) return -1;
            s->schema_off = OFF(v);
            s->schema_len = v.n;
            break;
        default:
            if ((t >> 3) <= 3 || skip(&p, end, t)) return -1;
        }
    }
    return 0;
}

int lj_otlp_scan(const uint8_t *buf, size_t len, lj_otlp_resource *resources, int resource_cap,
                 lj_otlp_scope *scopes, int scope_cap, int *n_scopes, uint64_t *records) {
    const uint8_t *base = buf, *p = buf, *end = buf + len;
    int n = 0, ns = 0, full = 0;
    uint64_t total = 0;
    if (len > UINT32_MAX) return LJ_OTLP_DECLINE;
    while (p < end) {
        uint32_t t;
        span_t rl;
        if (tag(&p, end, &t)) return LJ_OTLP_DECLINE;
        if (t != TAG(1, LEN)) {
            if ((t >> 3) == 1 || skip(&p, end, t)) return LJ_OTLP_DECLINE;
            continue;
        }
        if (len_field(&p, end, &rl)) return LJ_OTLP_DECLINE;
        /* ResourceLogs: resource (1), scope_logs (2), schema_url (3). */
        lj_otlp_resource r;
        memset(&r, 0, sizeof r);
        const uint8_t *q = rl.p, *qend = rl.p + rl.n;
        while (q < qend) {
            span_t v;
            if (tag(&q, qend, &t)) return LJ_OTLP_DECLINE;
            switch (t) {
            case TAG(1, LEN):
                if (r.has_resource || len_field(&q, qend, &v)) return LJ_OTLP_DECLINE;  /* twice: merged */
                r.has_resource = 1;
                r.resource_off = OFF(v);
                r.resource_len = v.n;
                break;
            case TAG(2, LEN):
                if (len_field(&q, qend, &v)) return LJ_OTLP_DECLINE;
                if (ns < scope_cap) {
                    if (scan_scope(base, v, &scopes[ns])) return LJ_OTLP_DECLINE;
                    total += scopes[ns].records;
                } else {
                    full = 1;
                }
                ns++;
                r.scopes++;
                break;
            case TAG(3, LEN):
                if (str_field(&q, qend, &v)) return LJ_OTLP_DECLINE;
                r.schema_off = OFF(v);
                r.schema_len = v.n;
                break;
            default:
                if ((t >> 3) <= 3 || skip(&q, qend, t)) return LJ_OTLP_DECLINE;
            }
        }
        if (n < resource_cap) resources[n] = r;
        else full = 1;
        n++;
    }
    *n_scopes = ns;
    *records = total;
    return full ? LJ_OTLP_ROOM : n;
}

int64_t lj_otlp_write(const uint8_t *buf, const lj_otlp_scope *scopes, int n_scopes,
                      const uint8_t *shared, const uint32_t *shared_ends,
                      const uint8_t *tail, size_t tail_len, lj_otlp_out *out) {
    writer_t w = {out->out, out->out + out->cap, out, 0, 0};
    uint64_t index = 0;
    for (int s = 0; s < n_scopes && !w.err; s++) {
        const uint8_t *p = buf + scopes[s].logs_off, *end = p + scopes[s].logs_len;
        uint32_t from = s ? shared_ends[s - 1] : 0;
        span_t text = {shared + from, shared_ends[s] - from};
        while (p < end && !w.err) {
            uint32_t t;
            span_t rec;
            if (tag(&p, end, &t)) return LJ_OTLP_DECLINE;  /* (scanned: cannot fail) */
            if (t != TAG(2, LEN)) {
                if (skip(&p, end, t)) return LJ_OTLP_DECLINE;
                continue;
            }
            if (len_field(&p, end, &rec)) return LJ_OTLP_DECLINE;
            uint8_t *at = w.p;
            put_record(&w, rec.p, rec.p + rec.n, text, index, tail, tail_len, &out->created_ms[index]);
            out->lens[index] = (uint32_t)(w.p - at);
            index++;
        }
        out->scope_ends[s] = (uint32_t)(w.p - out->out);
    }
    if (w.err) return w.err;
    out->doubles_met = w.doubles;
    if (w.doubles && !out->doubles_given) return LJ_OTLP_DOUBLES;
    return w.p - out->out;
}
