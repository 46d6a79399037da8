/* OTLP log records from protobuf wire bytes (or OTLP/JSON) straight to the bridge's JSON bodies.
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
 * deeper than MAX_NEST, a value out of its field's range, UTF-8 that is not well formed,
 * anything cut short. Finite doubles it does not format itself: it hands their values
 * back (LJ_OTLP_DOUBLES) and writes the text Python gives it (orjson's), so every byte
 * it writes is what records.py writes.
 *
 * OTLP/JSON likewise, as bridges/otlp/json_doc.py reads it: the document is checked whole
 * once, as strictly as orjson parses it (lj_json_read.h), then walked; whatever json_doc
 * would leave to protobuf's JSON parser (json_doc.Unsure) is declined, and so are escaped
 * keys, an id or a number in a string written with escapes, and a key given twice.
 */
#define _GNU_SOURCE  /* rawmemchr */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* The strict reader native/decode.c uses (lj_json.h with it), for OTLP/JSON: not all of it is used here. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "lj_json_read.h"
#pragma GCC diagnostic pop
#include "otlp.h"

#define MAX_NEST 16   /* nesting of arrays and key-value lists; deeper is declined */
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
    const uint8_t *base;  /* the request (OTLP/JSON: where a number's span starts from) */
    const struct jdoc_s *doc;  /* OTLP/JSON: the document */
    uint32_t doubles;     /* finite doubles met so far */
    int err;              /* an LJ_OTLP_* code once something failed */
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

/* A JSON string, escaped as orjson escapes: control characters, `"` and `\\`; everything
 * else as it is. */
static void put_str(writer_t *w, const uint8_t *s, uint32_t n) {
    if (!room(w, (size_t)n * 6 + 2)) return;
    uint8_t *p = w->p;
    *p++ = '"';
    for (uint32_t i = 0; i < n; i++) {
        uint8_t c = s[i];
        if (c >= 0x20 && c != '"' && c != '\\') *p++ = c;
        else p = lj_json_escape(p, c);
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

/* An id as lowercase hex, in quotes: from its bytes (`bytes.hex()`), or from hex digits
 * (OTLP/JSON, checked: `binascii.unhexlify(text).hex()`). */
static void put_hex(writer_t *w, int digits, span_t s) {
    size_t n = digits ? s.n : (size_t)s.n * 2;
    if (!room(w, n + 2)) return;
    uint8_t *p = w->p;
    *p++ = '"';
    for (uint32_t i = 0; i < s.n; i++) {
        uint8_t c = s.p[i];
        if (digits) {
            *p++ = c >= 'A' && c <= 'F' ? c + ('a' - 'A') : c;
        } else {
            *p++ = HEX[c >> 4];
            *p++ = HEX[c & 15];
        }
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

/* A finite double: the text Python gave for it (orjson's), or noted for Python (its value,
 * or for OTLP/JSON where its number is) with a stand-in, the call then ending in LJ_OTLP_DOUBLES. */
static void put_finite(writer_t *w, double d, const uint8_t *number, size_t n) {
    lj_otlp_out *o = w->o;
    uint32_t i = w->doubles++;
    if (o->doubles_given) {
        if (i >= o->doubles_given) {  /* not the doubles of the first call: cannot happen */
            w->err = LJ_OTLP_DECLINE;
            return;
        }
        uint32_t start = i ? o->doubles_ends[i - 1] : 0;
        put(w, o->doubles_text + start, o->doubles_ends[i] - start);
        return;
    }
    if (i < o->doubles_cap) {
        if (number) {
            o->double_spans[2 * i] = (uint32_t)(number - w->base);
            o->double_spans[2 * i + 1] = (uint32_t)n;
        } else {
            o->doubles[i] = d;
        }
    }
    put(w, "0", 1);
}

/* A double as values.any_value gives it: non-finite as its Python name ("inf", "-inf",
 * "nan"), finite as orjson writes it. */
static void put_double(writer_t *w, double d) {
    if (isnan(d)) PUT_LIT(w, "\"nan\"");
    else if (isinf(d) && d > 0) PUT_LIT(w, "\"inf\"");
    else if (isinf(d)) PUT_LIT(w, "\"-inf\"");
    else put_finite(w, d, NULL, 0);
}

/* -- AnyValue, KeyValue ---------------------------------------------------------------- */

enum { K_NONE = 0, K_STRING, K_BOOL, K_INT, K_DOUBLE, K_ARRAY, K_KVLIST, K_BYTES, K_STRINDEX };

/* An AnyValue, read: which member of its oneof it holds (K_NONE: none) and the member. */
typedef struct {
    int kind;
    uint64_t u;  /* bool, int, double (bits) */
    span_t s;    /* string, bytes, array, kvlist; OTLP/JSON: the member's text */
    jv_t j;      /* OTLP/JSON: the member */
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

/* The next key of an object being written: `,` after the first, the key, `:`. keys[*n]: the
 * keys so far, as read (equal text, equal key: a key given twice is declined, -1, and so is
 * a key past MAX_KEYS). json: the key is JSON string text already in orjson's spelling. */
static int put_key(writer_t *w, span_t *keys, int *n, span_t key, int json) {
    if (*n == MAX_KEYS) return -1;
    for (int i = 0; i < *n; i++)
        if (keys[i].n == key.n && memcmp(keys[i].p, key.p, key.n) == 0) return -1;
    keys[*n] = key;
    if ((*n)++) put_byte(w, ',');
    if (json) put(w, key.p, key.n);
    else put_str(w, key.p, key.n);
    put_byte(w, ':');
    return 0;
}

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
        span_t key = {kv.p, 0}, val = {NULL, 0};
        const uint8_t *q = kv.p, *qend = kv.p + kv.n;
        while (q < qend) {
            uint32_t kt;
            uint64_t ignored;
            if (tag(&q, qend, &kt)) goto bad;
            if (kt == TAG(1, LEN)) {
                if (str_field(&q, qend, &key)) goto bad;
            } else if (kt == TAG(2, LEN)) {
                if (val.p || len_field(&q, qend, &val)) goto bad;  /* twice: merged */
            } else if (kt == TAG(3, VARINT)) {
                if (varint(&q, qend, &ignored)) goto bad;
            } else if ((kt >> 3) <= 3 || skip(&q, qend, kt)) {
                goto bad;
            }
        }
        if (put_key(w, keys, &n, key, 0)) goto bad;
        any_t a = {K_NONE, 0, {NULL, 0}, {V_ABSENT, 0, NULL, NULL}};
        if (val.p && read_any(val.p, val.p + val.n, &a)) goto bad;
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
        if (depth >= MAX_NEST) {
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

/* A record's fields, read from either format, for put_head. */
typedef struct {
    int json;           /* read from OTLP/JSON: the spans below are JSON text */
    span_t body;        /* the AnyValue (protobuf: message, JSON: object); p NULL: none */
    span_t attributes;  /* protobuf: the record (its field 6); JSON: the array; n 0: none */
    span_t text, event; /* protobuf: the bytes; JSON: the string with its quotes; n 0: empty */
    span_t trace, span; /* protobuf: the bytes; JSON: the hex digits; n 0: empty */
    uint64_t time, observed, severity, dropped;
    uint32_t flags;
} head_t;

/* OTLP/JSON's (below). */
typedef struct jdoc_s jdoc_t;
static int jread_any(const jdoc_t *d, const uint8_t *obj, any_t *a);
static void jput_member(writer_t *w, const any_t *a, int depth);
static void jput_object(writer_t *w, const uint8_t *arr, int depth);
static void jput_str(writer_t *w, span_t s);

static void put_text(writer_t *w, const head_t *h, span_t s) {
    if (h->json) jput_str(w, s);
    else put_str(w, s.p, s.n);
}

/* One record's body: `{`, its fields in records._head's order, `,` when it has any, its
 * scope's shared text, its index, the tail. */
static void put_head(writer_t *w, const head_t *h, span_t shared, uint64_t index, const uint8_t *tail,
                     size_t tail_len, int64_t *created_ms) {
    uint8_t *first = w->p;
    put_byte(w, '{');
#define SEP() do { if (w->p != first + 1) put_byte(w, ','); } while (0)
    if (h->body.p) {
        any_t a;
        if (h->json ? jread_any(w->doc, h->body.p, &a) : read_any(h->body.p, h->body.p + h->body.n, &a)) goto bad;
        if (a.kind == K_STRING) {
            PUT_LIT(w, "\"message\":");
            put_text(w, h, a.s);
        } else if (a.kind != K_NONE) {
            PUT_LIT(w, "\"body\":");
            if (h->json) jput_member(w, &a, 0);
            else put_value(w, &a, 0);
        }
    }
    if (h->text.n) {
        SEP();
        PUT_LIT(w, "\"severity_text\":");
        put_text(w, h, h->text);
    }
    if (h->severity) {
        SEP();
        PUT_LIT(w, "\"severity_number\":");
        put_u64(w, h->severity);
    }
    if (h->attributes.n) {
        SEP();
        PUT_LIT(w, "\"attributes\":");
        if (h->json) jput_object(w, h->attributes.p, 0);
        else put_object(w, h->attributes.p, h->attributes.p + h->attributes.n, 6, 0);
    }
    if (h->dropped) {
        SEP();
        PUT_LIT(w, "\"dropped_attributes_count\":");
        put_u64(w, h->dropped);
    }
    if (h->event.n) {
        SEP();
        PUT_LIT(w, "\"event_name\":");
        put_text(w, h, h->event);
    }
    if (h->trace.n) {
        SEP();
        PUT_LIT(w, "\"trace_id\":");
        put_hex(w, h->json, h->trace);
    }
    if (h->span.n) {
        SEP();
        PUT_LIT(w, "\"span_id\":");
        put_hex(w, h->json, h->span);
    }
    if (h->flags) {
        SEP();
        PUT_LIT(w, "\"flags\":");
        put_u64(w, h->flags);
    }
    if (h->time) {
        SEP();
        PUT_LIT(w, "\"time_unix_nano\":");
        put_u64(w, h->time);
    }
    if (h->observed) {
        SEP();
        PUT_LIT(w, "\"observed_time_unix_nano\":");
        put_u64(w, h->observed);
    }
    SEP();
#undef SEP
    put(w, shared.p, shared.n);
    put_u64(w, index);
    put(w, tail, tail_len);
    *created_ms = (int64_t)((h->time ? h->time : h->observed) / 1000000);
    return;
bad:
    w->err = LJ_OTLP_DECLINE;
}

/* A LogRecord message's fields. */
static int read_record(const uint8_t *p, const uint8_t *end, head_t *h) {
    memset(h, 0, sizeof *h);
    h->attributes.p = p;
    while (p < end) {
        uint32_t t;
        span_t kv;
        if (tag(&p, end, &t)) return -1;
        switch (t) {
        case TAG(1, I64):
            if (end - p < 8) return -1;
            h->time = le64(p);
            p += 8;
            break;
        case TAG(11, I64):
            if (end - p < 8) return -1;
            h->observed = le64(p);
            p += 8;
            break;
        case TAG(2, VARINT):  /* an open enum (int32): a negative one is declined */
            if (varint(&p, end, &h->severity) || h->severity > INT32_MAX) return -1;
            break;
        case TAG(3, LEN): if (str_field(&p, end, &h->text)) return -1; break;
        case TAG(5, LEN): if (h->body.p || len_field(&p, end, &h->body)) return -1; break;  /* twice: merged */
        case TAG(6, LEN):
            if (len_field(&p, end, &kv)) return -1;
            h->attributes.n = (uint32_t)(end - h->attributes.p);  /* the whole record: put_object picks field 6 */
            break;
        case TAG(7, VARINT): if (varint(&p, end, &h->dropped) || h->dropped > UINT32_MAX) return -1; break;
        case TAG(8, I32):
            if (end - p < 4) return -1;
            h->flags = le32(p);
            p += 4;
            break;
        case TAG(9, LEN): if (len_field(&p, end, &h->trace)) return -1; break;
        case TAG(10, LEN): if (len_field(&p, end, &h->span)) return -1; break;
        case TAG(12, LEN): if (str_field(&p, end, &h->event)) return -1; break;
        default:
            if ((t >> 3) <= 12 || skip(&p, end, t)) return -1;  /* a known field with another wire type */
        }
    }
    return 0;
}

/* -- OTLP/JSON ----------------------------------------------------------------------- */

/* The document was checked whole by lj_otlp_json_scan (lj_json_read.h: as strictly as
 * orjson parses it), so from then on it is only found our way through: j_* read a value's
 * extent and kind without checking it again. Every container ends within the document. */

static const uint8_t *j_ws(const uint8_t *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* The checked document: where it starts, and where each of its objects and arrays closes
 * (close[offset of `{` or `[`] = offset of its `}` or `]`), so that a container is passed
 * over in one step however often the walk passes it. */
struct jdoc_s {
    const uint8_t *base;
    const uint32_t *close;
};

/* The string at p (its opening quote): just past its closing quote; *esc: it has escapes. */
static const uint8_t *j_str(const uint8_t *p, int *esc) {
    const uint8_t *q = p + 1;
    *esc = 0;
    for (;;) {
        const uint8_t *quote = rawmemchr(q, '"');
        const uint8_t *bs = memchr(q, '\\', (size_t)(quote - q));
        if (!bs) return quote + 1;
        *esc = 1;
        q = bs + 2;  /* the escaped character, whatever it is */
    }
}

/* Fills close[] (offsets from base) for the value [p, end) (checked whole: every bracket
 * matched); -1 past the nesting it has room for. */
static int j_index(const uint8_t *base, const uint8_t *p, const uint8_t *end, uint32_t *close) {
    uint32_t stack[MAX_DEPTH + 2];
    int top = 0, esc;
    while (p < end) {
        uint8_t c = *p;
        if (c == '"') {
            p = j_str(p, &esc);
            continue;
        }
        if (c == '{' || c == '[') {
            if (top == MAX_DEPTH + 2) return -1;
            stack[top++] = (uint32_t)(p - base);
        } else if (c == '}' || c == ']') {
            close[stack[--top]] = (uint32_t)(p - base);
        }
        p++;
    }
    return 0;
}

/* The value at p into v (kind, extent; strings: esc); returns just past it. Numbers are
 * typed as orjson types them (lj_json_read.h's number: V_INT, V_BIG, V_FLOAT). */
static const uint8_t *j_value(const jdoc_t *d, const uint8_t *p, jv_t *v) {
    v->s = p;
    v->esc = 0;
    switch (*p) {
    case '"':
        v->kind = V_STR;
        p = j_str(p, &v->esc);
        break;
    case '{':
    case '[':
        v->kind = *p == '{' ? V_OBJ : V_ARR;
        p = d->base + d->close[p - d->base] + 1;
        break;
    case 't': v->kind = V_TRUE; p += 4; break;
    case 'f': v->kind = V_FALSE; p += 5; break;
    case 'n': v->kind = V_NULL; p += 4; break;
    default: {
        int is_float = 0;
        while ((*p >= '0' && *p <= '9') || *p == '-' || *p == '+' || *p == '.' || *p == 'e' || *p == 'E') {
            if (*p == '.' || *p == 'e' || *p == 'E') is_float = 1;
            p++;
        }
        if (is_float) {
            v->kind = V_FLOAT;
        } else {
            int neg = *v->s == '-', over;
            uint64_t m = digits(v->s + neg, p, &over);
            v->kind = over || (neg && m > (uint64_t)INT64_MAX + 1) ? V_BIG : V_INT;
        }
    }
    }
    v->e = p;
    return p;
}

/* The next item of the array whose items continue at *pp (after its `[` or an item): 1 and
 * the item, or 0 at the array's end. */
static int j_item(const jdoc_t *d, const uint8_t **pp, jv_t *v) {
    const uint8_t *p = j_ws(*pp);
    if (*p == ',') p = j_ws(p + 1);
    if (*p == ']') return 0;
    *pp = j_value(d, p, v);
    return 1;
}

/* A field's code among `names` (name and code pairs, ending with a NULL name). */
typedef struct {
    const char *name;
    uint8_t len, code;
} jname_t;

#define NAME(s, c) {s, sizeof(s) - 1, c}
static const jname_t J_REQUEST[] = {NAME("resourceLogs", 1), NAME("resource_logs", 1), {NULL, 0, 0}};
static const jname_t J_RESOURCE_LOGS[] = {NAME("resource", 1), NAME("scopeLogs", 2), NAME("scope_logs", 2),
                                          NAME("schemaUrl", 3), NAME("schema_url", 3), {NULL, 0, 0}};
static const jname_t J_SCOPE_LOGS[] = {NAME("scope", 1), NAME("logRecords", 2), NAME("log_records", 2),
                                       NAME("schemaUrl", 3), NAME("schema_url", 3), {NULL, 0, 0}};
static const jname_t J_RECORD[] = {
    NAME("timeUnixNano", 1), NAME("time_unix_nano", 1), NAME("severityNumber", 2), NAME("severity_number", 2),
    NAME("severityText", 3), NAME("severity_text", 3), NAME("body", 5), NAME("attributes", 6),
    NAME("droppedAttributesCount", 7), NAME("dropped_attributes_count", 7), NAME("flags", 8),
    NAME("traceId", 9), NAME("trace_id", 9), NAME("spanId", 10), NAME("span_id", 10),
    NAME("observedTimeUnixNano", 11), NAME("observed_time_unix_nano", 11), NAME("eventName", 12),
    NAME("event_name", 12), {NULL, 0, 0}};
static const jname_t J_KEY_VALUE[] = {NAME("key", 1), NAME("value", 2), {NULL, 0, 0}};
static const jname_t J_VALUES[] = {NAME("values", 1), {NULL, 0, 0}};
static const jname_t J_ANY[] = {
    NAME("stringValue", K_STRING), NAME("string_value", K_STRING), NAME("boolValue", K_BOOL),
    NAME("bool_value", K_BOOL), NAME("intValue", K_INT), NAME("int_value", K_INT), NAME("doubleValue", K_DOUBLE),
    NAME("double_value", K_DOUBLE), NAME("arrayValue", K_ARRAY), NAME("array_value", K_ARRAY),
    NAME("kvlistValue", K_KVLIST), NAME("kvlist_value", K_KVLIST), NAME("bytesValue", K_BYTES),
    NAME("bytes_value", K_BYTES), NAME("stringValueStrindex", K_STRINDEX), NAME("string_value_strindex", K_STRINDEX),
    {NULL, 0, 0}};
#undef NAME

/* The members of the object at obj by field code into f[0, n) (kind V_ABSENT: not there),
 * unknown keys passed over; -1 where json_doc._fields is unsure (a field given twice, in
 * either spelling, or null; an extension key "[...]") or the key has escapes. */
static int j_fields(const jdoc_t *d, const uint8_t *obj, const jname_t *names, jv_t *f, int n) {
    for (int i = 0; i < n; i++) f[i].kind = V_ABSENT;
    const uint8_t *p = j_ws(obj + 1);
    while (*p != '}') {
        jv_t key, v;
        p = j_value(d, p, &key);
        p = j_value(d, j_ws(j_ws(p) + 1), &v);  /* past the colon */
        p = j_ws(p);
        if (*p == ',') p = j_ws(p + 1);
        const uint8_t *k = key.s + 1;
        size_t len = (size_t)(key.e - key.s) - 2;
        if (key.esc || (len && k[0] == '[')) return -1;
        for (const jname_t *name = names; name->name; name++) {
            if (name->len == len && (uint8_t)name->name[0] == k[0] && !memcmp(name->name, k, len)) {
                if (f[name->code].kind != V_ABSENT || v.kind == V_NULL) return -1;
                f[name->code] = v;
                break;
            }
        }
    }
    return 0;
}

static span_t inner(const jv_t *v) { /* a string's text without its quotes */
    span_t s = {v->s + 1, (uint32_t)(v->e - v->s - 2)};
    return s;
}

/* json_doc._int: a JSON integer, or its decimal text (ASCII digits, an optional `-`, at most
 * 21 characters), within the field's range: [0, max] (neg_ok 0) or int64 (neg_ok 1). A
 * number in an escaped string is declined. */
static int json_int(const jv_t *v, uint64_t max, int neg_ok, int *neg, uint64_t *mag) {
    const uint8_t *p, *end;
    if (v->kind == V_INT) {
        p = v->s;
        end = v->e;
    } else if (v->kind == V_STR && !v->esc) {
        p = v->s + 1;
        end = v->e - 1;
        size_t n = (size_t)(end - p);
        if (n == 0 || n > 21 || (p[0] == '-' && n == 1)) return -1;
        for (const uint8_t *q = p + (p[0] == '-'); q < end; q++)
            if (*q < '0' || *q > '9') return -1;
    } else {
        return -1;
    }
    int over;
    *neg = *p == '-';
    *mag = digits(p + *neg, end, &over);
    if (over) return -1;
    if (*mag == 0) *neg = 0;  /* -0 is 0 */
    if (*neg) return neg_ok && *mag <= (uint64_t)INT64_MAX + 1 ? 0 : -1;
    return *mag <= max ? 0 : -1;
}

static int json_uint(const jv_t *v, uint64_t max, uint64_t *out) {
    int neg;
    return json_int(v, max, 0, &neg, out);
}

/* json_doc._severity: an integer 0-24, or a SeverityNumber's name. */
static int json_severity(const jv_t *v, uint64_t *out) {
    static const char *const NAMES[] = {"UNSPECIFIED", "TRACE", "TRACE2", "TRACE3", "TRACE4", "DEBUG", "DEBUG2",
                                        "DEBUG3", "DEBUG4", "INFO", "INFO2", "INFO3", "INFO4", "WARN", "WARN2",
                                        "WARN3", "WARN4", "ERROR", "ERROR2", "ERROR3", "ERROR4", "FATAL", "FATAL2",
                                        "FATAL3", "FATAL4"};
    if (v->kind == V_INT) return json_uint(v, 24, out);
    if (v->kind != V_STR || v->esc) return -1;
    span_t s = inner(v);
    if (s.n < 16 || memcmp(s.p, "SEVERITY_NUMBER_", 16)) return -1;
    for (uint64_t i = 0; i < sizeof NAMES / sizeof *NAMES; i++) {
        if (strlen(NAMES[i]) == s.n - 16 && !memcmp(NAMES[i], s.p + 16, s.n - 16)) {
            *out = i;
            return 0;
        }
    }
    return -1;
}

/* json_doc._hex: "" or exactly 2 * size hex digits; the digits (n 0: none). */
static int json_hex(const jv_t *v, uint32_t size, span_t *out) {
    if (v->kind != V_STR || v->esc) return -1;
    *out = inner(v);
    if (out->n == 0) return 0;
    if (out->n != 2 * size) return -1;
    for (uint32_t i = 0; i < out->n; i++) {
        uint8_t c = out->p[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return -1;
    }
    return 0;
}

/* A string as orjson writes the str it parses to: without escapes, the same text; with
 * them, unescaped and escaped again orjson's way. s: the string with its quotes. */
static void jput_str(writer_t *w, span_t s) {
    const uint8_t *p = s.p + 1, *end = s.p + s.n - 1;
    if (!memchr(p, '\\', (size_t)(end - p))) {
        put(w, s.p, s.n);
        return;
    }
    if (!room(w, s.n)) return;  /* never longer than its JSON text */
    uint8_t *o = w->p;
    *o++ = '"';
    while (p < end) {
        uint8_t c = *p;
        if (c != '\\') {
            *o++ = c;
            p++;
            continue;
        }
        uint32_t cp = 0;
        switch (p[1]) {
        case 'u':
            lj_hex4(p + 2, &cp);
            p += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {  /* a pair, checked whole */
                uint32_t lo = 0xDC00;
                lj_hex4(p + 2, &lo);
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            break;
        case 'b': cp = '\b'; p += 2; break;
        case 'f': cp = '\f'; p += 2; break;
        case 'n': cp = '\n'; p += 2; break;
        case 'r': cp = '\r'; p += 2; break;
        case 't': cp = '\t'; p += 2; break;
        default: cp = p[1]; p += 2; break;  /* " \ / */
        }
        if (cp >= 0x20 && cp != '"' && cp != '\\') o += lj_utf8_put(o, cp);
        else o = lj_json_escape(o, (uint8_t)cp);
    }
    *o++ = '"';
    w->p = o;
}

/* bytesValue as json_doc takes it: canonical base64 (what b64encode(b64decode(text)) gives
 * back), or declined. */
static int base64_canonical(span_t s) {
    if (s.n % 4) return 0;
    uint32_t pad = s.n && s.p[s.n - 1] == '=' ? (s.p[s.n - 2] == '=' ? 2 : 1) : 0;
    uint32_t last = 0;
    for (uint32_t i = 0; i < s.n - pad; i++) {
        uint8_t c = s.p[i];
        if (c >= 'A' && c <= 'Z') last = c - 'A';
        else if (c >= 'a' && c <= 'z') last = c - 'a' + 26;
        else if (c >= '0' && c <= '9') last = c - '0' + 52;
        else if (c == '+') last = 62;
        else if (c == '/') last = 63;
        else return 0;
    }
    return pad == 2 ? (last & 15) == 0 : pad == 1 ? (last & 3) == 0 : 1;
}

/* An AnyValue object: which member it holds, and the member (a string member is a string). */
static int jread_any(const jdoc_t *d, const uint8_t *obj, any_t *a) {
    jv_t f[K_STRINDEX + 1];
    if (*obj != '{' || j_fields(d, obj, J_ANY, f, K_STRINDEX + 1)) return -1;
    a->kind = K_NONE;
    for (int k = K_STRING; k <= K_STRINDEX; k++) {
        if (f[k].kind == V_ABSENT) continue;
        if (a->kind != K_NONE) return -1;  /* two members of the oneof */
        a->kind = k;
        a->j = f[k];
        a->s = (span_t){f[k].s, (uint32_t)(f[k].e - f[k].s)};
    }
    return a->kind == K_STRING && a->j.kind != V_STR ? -1 : 0;
}

/* An AnyValue's member as json_doc._any gives it; declined where json_doc is unsure. */
static void jput_member(writer_t *w, const any_t *a, int depth) {
    const jv_t *v = &a->j;
    jv_t f[2], item;
    int neg;
    uint64_t m;
    switch (a->kind) {
    case K_NONE: PUT_LIT(w, "null"); return;
    case K_STRING: jput_str(w, a->s); return;  /* (a string: jread_any) */
    case K_BOOL:
        if (v->kind == V_TRUE) PUT_LIT(w, "true");
        else if (v->kind == V_FALSE) PUT_LIT(w, "false");
        else break;
        return;
    case K_INT:
        if (json_int(v, INT64_MAX, 1, &neg, &m)) break;
        if (neg) put_byte(w, '-');
        put_u64(w, m);
        return;
    case K_DOUBLE:  /* a number: Python writes it (json_doc.double_text) or declines it */
        if (v->kind != V_INT && v->kind != V_BIG && v->kind != V_FLOAT) break;
        put_finite(w, 0, a->s.p, a->s.n);
        return;
    case K_ARRAY:
    case K_KVLIST:
        if (v->kind != V_OBJ || depth >= MAX_NEST || j_fields(w->doc, v->s, J_VALUES, f, 2)) break;
        if (f[1].kind == V_ABSENT) {
            if (a->kind == K_ARRAY) PUT_LIT(w, "[]");
            else PUT_LIT(w, "{}");
            return;
        }
        if (f[1].kind != V_ARR) break;
        if (a->kind == K_KVLIST) {
            jput_object(w, f[1].s, depth + 1);
            return;
        }
        const uint8_t *p = f[1].s + 1;
        int n = 0;
        put_byte(w, '[');
        while (!w->err && j_item(w->doc, &p, &item)) {
            any_t x;
            if (jread_any(w->doc, item.s, &x)) {  /* (not an object, too) */
                w->err = LJ_OTLP_DECLINE;
                return;
            }
            if (n++) put_byte(w, ',');
            jput_member(w, &x, depth + 1);
        }
        put_byte(w, ']');
        return;
    case K_BYTES:
        if (v->kind != V_STR || v->esc || !base64_canonical(inner(v))) break;
        put(w, a->s.p, a->s.n);
        return;
    default:
        break;  /* stringValueStrindex: json_doc leaves it to protobuf */
    }
    if (!w->err) w->err = LJ_OTLP_DECLINE;
}

/* The array at arr of KeyValue objects as one JSON object (json_doc._attributes); a key
 * given twice or written with escapes is declined. */
static void jput_object(writer_t *w, const uint8_t *arr, int depth) {
    span_t keys[MAX_KEYS];
    const uint8_t *p = arr + 1;
    jv_t item, f[3];
    int n = 0;
    put_byte(w, '{');
    while (!w->err && j_item(w->doc, &p, &item)) {
        if (item.kind != V_OBJ || j_fields(w->doc, item.s, J_KEY_VALUE, f, 3)) goto bad;
        span_t key = {(const uint8_t *)"\"\"", 2};
        if (f[1].kind != V_ABSENT) {
            if (f[1].kind != V_STR || f[1].esc) goto bad;
            key.p = f[1].s;
            key.n = (uint32_t)(f[1].e - f[1].s);
        }
        if (put_key(w, keys, &n, key, 1)) goto bad;
        any_t a = {K_NONE, 0, {NULL, 0}, {V_ABSENT, 0, NULL, NULL}};
        if (f[2].kind != V_ABSENT && jread_any(w->doc, f[2].s, &a)) goto bad;
        jput_member(w, &a, depth);
    }
    put_byte(w, '}');
    return;
bad:
    w->err = LJ_OTLP_DECLINE;
}

/* A LogRecord object's fields (json_doc._head's reading of them). */
static int read_json_record(const jdoc_t *d, const jv_t *rec, head_t *h) {
    jv_t f[13];
    memset(h, 0, sizeof *h);
    h->json = 1;
    if (rec->kind != V_OBJ || j_fields(d, rec->s, J_RECORD, f, 13)) return -1;
    if (f[5].kind != V_ABSENT) {
        h->body.p = f[5].s;
        h->body.n = (uint32_t)(f[5].e - f[5].s);
    }
    if (f[3].kind != V_ABSENT) {
        if (f[3].kind != V_STR) return -1;
        if (f[3].e - f[3].s > 2) h->text = (span_t){f[3].s, (uint32_t)(f[3].e - f[3].s)};
    }
    if (f[2].kind != V_ABSENT && json_severity(&f[2], &h->severity)) return -1;
    if (f[6].kind != V_ABSENT) {
        if (f[6].kind != V_ARR) return -1;
        if (*j_ws(f[6].s + 1) != ']') h->attributes = (span_t){f[6].s, (uint32_t)(f[6].e - f[6].s)};
    }
    if (f[7].kind != V_ABSENT && json_uint(&f[7], UINT32_MAX, &h->dropped)) return -1;
    if (f[12].kind != V_ABSENT) {
        if (f[12].kind != V_STR) return -1;
        if (f[12].e - f[12].s > 2) h->event = (span_t){f[12].s, (uint32_t)(f[12].e - f[12].s)};
    }
    if (f[9].kind != V_ABSENT && json_hex(&f[9], 16, &h->trace)) return -1;
    if (f[10].kind != V_ABSENT && json_hex(&f[10], 8, &h->span)) return -1;
    uint64_t flags = 0;
    if (f[8].kind != V_ABSENT && json_uint(&f[8], UINT32_MAX, &flags)) return -1;
    h->flags = (uint32_t)flags;
    if (f[1].kind != V_ABSENT && json_uint(&f[1], UINT64_MAX, &h->time)) return -1;
    if (f[11].kind != V_ABSENT && json_uint(&f[11], UINT64_MAX, &h->observed)) return -1;
    return 0;
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

/* One record's body at the writer's place, its length and time into the tables. */
static void put_one(writer_t *w, const head_t *h, span_t shared, uint64_t *index, const uint8_t *tail,
                    size_t tail_len) {
    uint8_t *at = w->p;
    put_head(w, h, shared, *index, tail, tail_len, &w->o->created_ms[*index]);
    w->o->lens[*index] = (uint32_t)(w->p - at);
    ++*index;
}

/* Scope s's shared text. */
static span_t shared_of(const uint8_t *shared, const uint32_t *shared_ends, int s) {
    uint32_t from = s ? shared_ends[s - 1] : 0;
    span_t text = {shared + from, shared_ends[s] - from};
    return text;
}

static int64_t finish(writer_t *w) {
    if (w->err) return w->err;
    w->o->doubles_met = w->doubles;
    if (w->doubles && !w->o->doubles_given) return LJ_OTLP_DOUBLES;
    return w->p - w->o->out;
}

int64_t lj_otlp_write(const uint8_t *buf, const lj_otlp_scope *scopes, int n_scopes,
                      const uint8_t *shared, const uint32_t *shared_ends,
                      const uint8_t *tail, size_t tail_len, lj_otlp_out *out) {
    writer_t w = {out->out, out->out + out->cap, out, buf, NULL, 0, 0};
    uint64_t index = 0;
    for (int s = 0; s < n_scopes && !w.err; s++) {
        const uint8_t *p = buf + scopes[s].logs_off, *end = p + scopes[s].logs_len;
        span_t text = shared_of(shared, shared_ends, s);
        while (p < end && !w.err) {
            uint32_t t;
            span_t rec;
            head_t h;
            if (tag(&p, end, &t)) return LJ_OTLP_DECLINE;  /* (scanned: cannot fail) */
            if (t != TAG(2, LEN)) {
                if (skip(&p, end, t)) return LJ_OTLP_DECLINE;
                continue;
            }
            if (len_field(&p, end, &rec) || read_record(rec.p, rec.p + rec.n, &h)) return LJ_OTLP_DECLINE;
            put_one(&w, &h, text, &index, tail, tail_len);
        }
        out->scope_ends[s] = (uint32_t)(w.p - out->out);
    }
    return finish(&w);
}

/* -- OTLP/JSON, the request ------------------------------------------------------------ */

#define JOFF(v) ((uint32_t)((v).s - base))
#define JLEN(v) ((uint32_t)((v).e - (v).s))

int lj_otlp_json_scan(const uint8_t *buf, size_t len, uint32_t *close, lj_otlp_resource *resources,
                      int resource_cap, lj_otlp_scope *scopes, int scope_cap, int *n_scopes, uint64_t *records) {
    const uint8_t *base = buf;
    const jdoc_t doc_ = {buf, close}, *d = &doc_;
    rd_t r = {buf, buf + len, 0};
    jv_t doc, f[2], rl, g[4], sl, h[4], rec;
    int n = 0, ns = 0, full = 0;
    uint64_t total = 0;
    if (len > UINT32_MAX) return LJ_OTLP_DECLINE;
    ws(&r);
    if (value(&r, &doc, 0)) return LJ_OTLP_DECLINE;  /* checked whole, as strictly as orjson parses it */
    ws(&r);
    if (r.p != r.end || doc.kind != V_OBJ || j_index(buf, doc.s, doc.e, close)) return LJ_OTLP_DECLINE;
    if (j_fields(d, doc.s, J_REQUEST, f, 2)) return LJ_OTLP_DECLINE;
    if (f[1].kind == V_ABSENT) goto done;
    if (f[1].kind != V_ARR) return LJ_OTLP_DECLINE;
    for (const uint8_t *p = f[1].s + 1; j_item(d, &p, &rl);) {
        /* ResourceLogs: resource (1), scopeLogs (2), schemaUrl (3). */
        lj_otlp_resource res;
        memset(&res, 0, sizeof res);
        if (rl.kind != V_OBJ || j_fields(d, rl.s, J_RESOURCE_LOGS, g, 4)) return LJ_OTLP_DECLINE;
        if (g[1].kind != V_ABSENT) {
            res.has_resource = 1;
            res.resource_off = JOFF(g[1]);
            res.resource_len = JLEN(g[1]);
        }
        if (g[3].kind != V_ABSENT) {
            res.schema_off = JOFF(g[3]);
            res.schema_len = JLEN(g[3]);
        }
        if (g[2].kind == V_ABSENT) g[2] = (jv_t){V_ARR, 0, (const uint8_t *)"[]", NULL};  /* no scopes */
        if (g[2].kind != V_ARR) return LJ_OTLP_DECLINE;
        for (const uint8_t *q = g[2].s + 1; j_item(d, &q, &sl);) {
            /* ScopeLogs: scope (1), logRecords (2), schemaUrl (3). */
            if (sl.kind != V_OBJ || j_fields(d, sl.s, J_SCOPE_LOGS, h, 4)) return LJ_OTLP_DECLINE;
            if (h[2].kind != V_ABSENT && h[2].kind != V_ARR) return LJ_OTLP_DECLINE;
            if (ns < scope_cap) {
                lj_otlp_scope *sc = &scopes[ns];
                memset(sc, 0, sizeof *sc);
                if (h[1].kind != V_ABSENT) {
                    sc->has_scope = 1;
                    sc->scope_off = JOFF(h[1]);
                    sc->scope_len = JLEN(h[1]);
                }
                if (h[3].kind != V_ABSENT) {
                    sc->schema_off = JOFF(h[3]);
                    sc->schema_len = JLEN(h[3]);
                }
                if (h[2].kind == V_ARR) {
                    sc->logs_off = JOFF(h[2]);
                    sc->logs_len = sc->record_bytes = JLEN(h[2]);
                    for (const uint8_t *t = h[2].s + 1; j_item(d, &t, &rec);) sc->records++;
                }
                total += sc->records;
            } else {
                full = 1;
            }
            ns++;
            res.scopes++;
        }
        if (n < resource_cap) resources[n] = res;
        else full = 1;
        n++;
    }
done:
    *n_scopes = ns;
    *records = total;
    return full ? LJ_OTLP_ROOM : n;
}

int64_t lj_otlp_json_write(const uint8_t *buf, const uint32_t *close, const lj_otlp_scope *scopes, int n_scopes,
                           const uint8_t *shared, const uint32_t *shared_ends,
                           const uint8_t *tail, size_t tail_len, lj_otlp_out *out) {
    const jdoc_t doc = {buf, close};
    writer_t w = {out->out, out->out + out->cap, out, buf, &doc, 0, 0};
    uint64_t index = 0;
    for (int s = 0; s < n_scopes && !w.err; s++) {
        span_t text = shared_of(shared, shared_ends, s);
        jv_t rec;
        head_t h;
        for (const uint8_t *p = buf + scopes[s].logs_off + 1; scopes[s].logs_len && !w.err && j_item(&doc, &p, &rec);) {
            if (read_json_record(&doc, &rec, &h)) return LJ_OTLP_DECLINE;
            put_one(&w, &h, text, &index, tail, tail_len);
        }
        out->scope_ends[s] = (uint32_t)(w.p - out->out);
    }
    return finish(&w);
}
