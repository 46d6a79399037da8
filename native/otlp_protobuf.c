/* OTLP log records from protobuf wire bytes straight to the bridge's JSON bodies: the
 * wire reader (varints, fixed-width and length-delimited fields; no protobuf library), the
 * walk of the request's messages (ExportLogsServiceRequest down to AnyValue), and the
 * module's protobuf calls, lj_otlp_scan and lj_otlp_write (otlp.h).
 *
 * Why: reading a record out of upb's Python objects cost the bridge more than everything
 * else it does per record (a KeyValue and its AnyValue about 0.4 us each from Python;
 * docs/protocols/otlp.md, "Speed"). Each record's fields are written by otlp_body.c as the
 * JSON records.py writes for them, with orjson's escapes, then the scope's shared text and
 * the record's index. No libzmq here: this module is not bound to it.
 *
 * It reads only what it can read exactly as upb does, and declines the rest for the
 * Python path (records.py), which then answers as it always did: a key given twice in one
 * object, a singular message given twice (protobuf merges them), two members of
 * AnyValue's oneof in one value, a known field with another wire type, groups, nesting
 * deeper than MAX_NEST, a value out of its field's range, UTF-8 that is not well formed,
 * anything cut short. Finite doubles it does not format itself: it hands their values
 * back (LJ_OTLP_DOUBLES) and writes the text Python gives it (orjson's), so every byte
 * it writes is what records.py writes.
 */
#include <stdint.h>
#include <string.h>

#include "otlp_body.h"

/* Wire types. */
#define VARINT 0
#define I64 1
#define LEN 2
#define I32 5

#define TAG(field, type) (((uint32_t)(field) << 3) | (type))

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

/* -- AnyValue, KeyValue ---------------------------------------------------------------- */

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

/* What otlp_body.c needs written the protobuf way. */
static int proto_read_any(const writer_t *w, span_t value, any_t *a) {
    (void)w;
    return read_any(value.p, value.p + value.n, a);
}

static void proto_put_attributes(writer_t *w, span_t record) { put_object(w, record.p, record.p + record.n, 6, 0); }

static void proto_put_text(writer_t *w, span_t s) { put_str(w, s.p, s.n); }

const otlp_format_t OTLP_PROTOBUF = {proto_read_any, put_value, proto_put_attributes, proto_put_text, 0};

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
    writer_t w = {.p = out->out, .end = out->out + out->cap, .o = out, .base = buf, .format = &OTLP_PROTOBUF};
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
            put_record(&w, &h, text, &index, tail, tail_len);
        }
        out->scope_ends[s] = (uint32_t)(w.p - out->out);
    }
    return finish(&w);
}
