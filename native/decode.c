/* Logjam messages to rows of the `messages` table, a drained chunk per call (decode.h).
 *
 * importer/decode.py's BatchBuilder.add_raw is the reference, and this follows it field for
 * field. What C does not do exactly as the reference would, it does not do: a compressed
 * body, a body that is not one JSON object, a key or number it cannot read as orjson does,
 * a float that would have to become text... stops the run at that message (LJ_DEC_DEFER),
 * and the Python path makes that row and hands it back cell by cell. So every row here
 * comes from a body orjson would parse to a dict: the JSON is checked as strictly as
 * orjson checks it (RFC 8259, UTF-8, surrogate pairs, finite numbers), and anything else
 * is deferred, never guessed (the reader is lj_json_read.h).
 *
 * Bounds: every read is checked against the body's end; column buffers grow by doubling up
 * to INT32_MAX bytes (Arrow's string offsets), past which the chunk is full.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "lj_json_read.h"

#define MAX_CREATED_MS 253402300799999LL /* Spark's timestamps end with year 9999 */
#define MAX_EVENT_ID_BYTES 512
#define MAX_NAMES 1000000
#define COL_LIMIT 0x7fffffffLL

/* ------------------------------------------------------------------ columns */

static int grow(uint8_t **data, int64_t *room, int64_t need, int64_t limit) {
    if (need <= *room) return 0;
    if (need > limit) return -1;
    int64_t room2 = *room ? *room : 4096;
    while (room2 < need) room2 *= 2;
    if (room2 > limit) room2 = limit;
    uint8_t *p = realloc(*data, (size_t)room2);
    if (!p) return -2;
    *data = p;
    *room = room2;
    return 0;
}

static void set_valid(uint8_t *bits, int64_t row, int valid) {
    if (valid) bits[row >> 3] |= (uint8_t)(1u << (row & 7));
    else bits[row >> 3] &= (uint8_t)~(1u << (row & 7));
}

/* Column writes for row d->rows: each reserves its bytes first (0, or -1 full, -2 no memory). */
static int s_bytes(lj_dec_t *d, int col, const uint8_t *p, int64_t n) {
    lj_scol_t *c = &d->s[col];
    int g = grow(&c->data, &c->room, c->len + n, COL_LIMIT);
    if (g) return g;
    if (n) memcpy(c->data + c->len, p, (size_t)n);
    c->len += n;
    return 0;
}

static void s_end(lj_dec_t *d, int col, int valid) {
    lj_scol_t *c = &d->s[col];
    c->offsets[d->rows + 1] = (int32_t)c->len;
    set_valid(c->valid, d->rows, valid);
}

static int s_put(lj_dec_t *d, int col, const uint8_t *p, int64_t n) {
    int g = s_bytes(d, col, p, n);
    if (g) return g;
    s_end(d, col, 1);
    return 0;
}

static void s_null(lj_dec_t *d, int col) {
    s_end(d, col, 0);
}

static void n_put(lj_dec_t *d, int col, int64_t value, int valid) {
    lj_ncol_t *c = &d->n[col];
    c->values[d->rows] = valid ? value : 0;
    set_valid(c->valid, d->rows, valid);
}

/* A JSON string's text, unescaped (it was checked by string()). */
static int s_json_string(lj_dec_t *d, int col, const jv_t *v) {
    const uint8_t *p = v->s + 1, *end = v->e - 1;
    if (!v->esc) return s_put(d, col, p, end - p);
    int g;
    while (p < end) {
        const uint8_t *run = p;
        while (p < end && *p != '\\') p++;
        if ((g = s_bytes(d, col, run, p - run))) return g;
        if (p >= end) break;
        uint8_t out[4];
        int n = 1;
        switch (p[1]) {
        case 'b': out[0] = '\b'; break;
        case 'f': out[0] = '\f'; break;
        case 'n': out[0] = '\n'; break;
        case 'r': out[0] = '\r'; break;
        case 't': out[0] = '\t'; break;
        case 'u': {
            uint32_t u = 0, lo = 0xdc00; /* both were checked by string() */
            lj_hex4(p + 2, &u);
            if (u >= 0xd800 && u <= 0xdbff) {
                lj_hex4(p + 8, &lo);
                u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
                p += 6;
            }
            p += 4;
            n = (int)lj_utf8_put(out, u);
            break;
        }
        default: out[0] = p[1]; /* " \ / */
        }
        p += 2;
        if ((g = s_bytes(d, col, out, n))) return g;
    }
    s_end(d, col, 1);
    return 0;
}

/* ------------------------------------------------------------------ the reference's rules */

#define DEFER 1 /* a cell the Python path must make */
#define DUPLICATE 3 /* the row's key is remembered (row() returns -DUPLICATE) */

/* decode.py's _text: a string as is, true/false, an int as its decimal text; objects and
 * arrays are NULL. A float's text (Python's repr) is deferred. */
static int s_text(lj_dec_t *d, int col, const jv_t *v) {
    switch (v->kind) {
    case V_ABSENT:
    case V_NULL:
    case V_OBJ:
    case V_ARR: s_null(d, col); return 0;
    case V_STR: return s_json_string(d, col, v);
    case V_TRUE: return s_put(d, col, (const uint8_t *)"true", 4);
    case V_FALSE: return s_put(d, col, (const uint8_t *)"false", 5);
    case V_INT:
        if (v->e - v->s == 2 && v->s[0] == '-' && v->s[1] == '0') return s_put(d, col, (const uint8_t *)"0", 1);
        return s_put(d, col, v->s, v->e - v->s);
    default: return -DEFER; /* V_FLOAT, V_BIG: Python's float repr */
    }
}

/* Python truthiness of a JSON value (for host's `name or hostname`); -1 when it needs a float's value. */
static int truthy(const jv_t *v) {
    switch (v->kind) {
    case V_ABSENT:
    case V_NULL:
    case V_FALSE: return 0;
    case V_TRUE: return 1;
    case V_INT: return !(v->e - v->s == 1 && v->s[0] == '0') && !(v->e - v->s == 2 && v->s[0] == '-' && v->s[1] == '0');
    case V_STR: return v->e - v->s > 2;
    case V_OBJ:
    case V_ARR: return !empty(v);
    default: return -1;
    }
}

/* A V_INT's value; *fits_i64 is 0 for one past INT64_MAX (then the value is its uint64 bits). */
static int64_t int_value(const jv_t *v, int *fits_i64) {
    int neg = v->s[0] == '-', over;
    uint64_t m = digits(v->s + neg, v->e, &over);
    *fits_i64 = neg || m <= (uint64_t)INT64_MAX;
    return neg ? negated(m) : (int64_t)m;
}

/* decode.py's _int (severity, code): an int within int64; a string of ASCII digits with at
 * most one leading '-'. Non-ASCII or escaped strings, and several '-', are deferred. */
static int n_int(lj_dec_t *d, int col, const jv_t *v) {
    int fits;
    if (v->kind == V_INT) {
        int64_t x = int_value(v, &fits);
        n_put(d, col, x, fits);
        return 0;
    }
    if (v->kind != V_STR) {
        n_put(d, col, 0, 0);
        return 0;
    }
    if (v->esc) return -DEFER;
    const uint8_t *p = v->s + 1, *end = v->e - 1;
    for (const uint8_t *q = p; q < end; q++)
        if (*q >= 0x80) return -DEFER;
    int minus = 0;
    while (p < end && *p == '-') p++, minus++;
    if (p == end) {
        n_put(d, col, 0, 0);
        return 0;
    }
    for (const uint8_t *q = p; q < end; q++)
        if (*q < '0' || *q > '9') {
            n_put(d, col, 0, 0);
            return 0;
        }
    if (minus > 1) { /* int("--1") raises: no number */
        n_put(d, col, 0, 0);
        return 0;
    }
    int over;
    uint64_t m = digits(p, end, &over);
    if (over || m > (uint64_t)INT64_MAX + (minus ? 1 : 0)) n_put(d, col, 0, 0);
    else n_put(d, col, minus ? negated(m) : (int64_t)m, 1);
    return 0;
}

/* decode.py's _float (total_time): a float, or an int as a float; strings are deferred. */
static int n_float(lj_dec_t *d, int col, const jv_t *v) {
    double x;
    if (v->kind == V_FLOAT) {
        char buf[MAX_NUMBER_TEXT + 1];
        size_t len = (size_t)(v->e - v->s);
        memcpy(buf, v->s, len);
        buf[len] = 0;
        x = strtod(buf, NULL);
    } else if (v->kind == V_INT) {
        int fits;
        int64_t i = int_value(v, &fits);
        x = fits ? (double)i : (double)(uint64_t)i;
    } else if (v->kind == V_STR || v->kind == V_BIG) {
        return -DEFER;
    } else {
        n_put(d, col, 0, 0);
        return 0;
    }
    int64_t bits;
    memcpy(&bits, &x, 8);
    n_put(d, col, bits, 1);
    return 0;
}

/* ------------------------------------------------------------------ rows */

enum { K_MESSAGE, K_HOST, K_LEVEL, K_ACTION, K_REQUEST_ID, K_SEVERITY, K_CODE, K_TOTAL_TIME, K_METADATA, K_LOG,
       K_LOG_LEVEL, K_SEVERITY_TEXT, K_SEVERITY_NUMBER, K_SYSLOG, K_TRACE_ID, K_TRACE, K_TRACE_DOT, K_TRACE_CAMEL,
       K_SPAN_ID, K_SPAN, K_SPAN_DOT, K_SPAN_CAMEL, NKEYS };
static const char *const KEYS[NKEYS] = {"message", "host", "level", "action", "request_id", "severity", "code",
                                        "total_time", "@metadata", "log", "log.level", "severity_text",
                                        "severity_number", "syslog", "trace_id", "trace", "trace.id", "traceId",
                                        "span_id", "span", "span.id", "spanId"};
static const char *const HOST_KEYS[2] = {"name", "hostname"};
static const char *const LOG_KEYS[1] = {"level"};
static const char *const META_KEYS[2] = {"_id", "protocol"};
static const char *const ID_KEYS[1] = {"id"};
static const char *const SYSLOG_KEYS[1] = {"severity"};
/* decode.py's _OTEL_LEVELS (SeverityNumber 1-4, 5-8, ... by range) and _SYSLOG_LEVELS (0..7). */
static const char *const OTEL_LEVELS[6] = {"TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"};
static const char *const SYSLOG_LEVELS[8] = {"emerg", "alert", "crit", "err", "warning", "notice", "info", "debug"};

static int absent(const jv_t *v) { return v->kind == V_ABSENT || v->kind == V_NULL; }

static int s_word(lj_dec_t *d, int col, const char *w) { return s_put(d, col, (const uint8_t *)w, (int64_t)strlen(w)); }

/* decode.py's _level_from_numbers: a non-empty severity_text, else severity_number 1..24 as its
 * OTel range's name, else syslog.severity 0..7 as its RFC 5424 keyword; else NULL. */
static int level_from_numbers(lj_dec_t *d, const jv_t *f) {
    int fits;
    const jv_t *text = &f[K_SEVERITY_TEXT], *number = &f[K_SEVERITY_NUMBER];
    if (text->kind == V_STR && text->e - text->s > 2) return s_json_string(d, LJ_S_LEVEL, text);
    if (number->kind == V_INT) {
        int64_t n = int_value(number, &fits);
        if (fits && n >= 1 && n <= 24) return s_word(d, LJ_S_LEVEL, OTEL_LEVELS[(n - 1) >> 2]);
    }
    if (f[K_SYSLOG].kind == V_OBJ) {
        jv_t sev[1] = {{0}};
        if (lookup(&f[K_SYSLOG], SYSLOG_KEYS, 1, sev)) return -DEFER;
        if (sev[0].kind == V_INT) {
            int64_t n = int_value(&sev[0], &fits);
            if (fits && n >= 0 && n <= 7) return s_word(d, LJ_S_LEVEL, SYSLOG_LEVELS[n]);
        }
    }
    s_null(d, LJ_S_LEVEL);
    return 0;
}

/* decode.py's _hex_id: a string of 2..64 hex digits, an even number of them, lowercased; else NULL.
 * An escaped string is deferred (its digits need unescaping first). */
static int s_hex_id(lj_dec_t *d, int col, const jv_t *v) {
    uint8_t out[64];
    if (v->kind == V_STR && v->esc) return -DEFER;
    int64_t n = v->kind == V_STR ? v->e - v->s - 2 : 0;
    if (n > 64 || (n & 1)) n = 0;
    for (int64_t i = 0; i < n; i++) {
        /* | 0x20 lowercases A-F and keeps digits; the other bytes it makes hex digits of
         * (0x10-0x19) are control bytes, which no JSON string holds unescaped. */
        out[i] = v->s[1 + i] | 0x20;
        if (!((out[i] >= '0' && out[i] <= '9') || (out[i] >= 'a' && out[i] <= 'f'))) n = 0;
    }
    if (n) return s_put(d, col, out, n);
    s_null(d, col);
    return 0;
}

/* ECS's `<x>.<key>`, nested or dotted: `key` of `obj` when that is an object (looked up into
 * `slot`), else the dotted key's value. Sets *v; -DEFER when the object cannot be read here. */
static int nested_or_dotted(const jv_t *obj, const char *const *key, const jv_t *dotted, jv_t *slot,
                            const jv_t **v) {
    if (obj->kind != V_OBJ) {
        *v = dotted;
        return 0;
    }
    if (lookup(obj, key, 1, slot)) return -DEFER;
    *v = slot;
    return 0;
}

/* decode.py's _id: `<x>_id`, else `<x>.id` (nested, else dotted), else `<x>Id`;
 * the first present and not null, checked by s_hex_id. */
static int s_id(lj_dec_t *d, int col, const jv_t *f, int k_id, int k_obj, int k_dot, int k_camel) {
    jv_t id[1] = {{0}};
    const jv_t *v = &f[k_id];
    if (absent(v)) {
        if (nested_or_dotted(&f[k_obj], ID_KEYS, &f[k_dot], id, &v)) return -DEFER;
        if (absent(v)) v = &f[k_camel];
    }
    return s_hex_id(d, col, v);
}

/* The row's created_at (microseconds), as importer/decode.py's `created_us` (change both
 * together; a deferred row takes Python's): a created_ms of 0 or past year 9999 is the arrival
 * time. The partition's date comes from it, a chunk at a time (table/event_time.py). */
static int64_t created_us(uint64_t created_ms, int64_t ingested_us) {
    int64_t ms = created_ms > (uint64_t)MAX_CREATED_MS || created_ms == 0 ? ingested_us / 1000 : (int64_t)created_ms;
    return ms * 1000;
}

/* Everything about one row but the stream's names and numbers from its meta frame:
 * the body's fields. 0, -DEFER, or a column error (-1 full, -2 no memory). */
static int body_cells(lj_dec_t *d, const jv_t *f, const jv_t *meta, const jv_t *eid) {
    int g;
    jv_t host[2] = {{0}}, log[1] = {{0}};
    /* message */
    if ((g = s_text(d, LJ_S_MESSAGE, &f[K_MESSAGE]))) return g;
    /* host: a string, or ECS {"name": ...} (else "hostname") */
    if (f[K_HOST].kind == V_OBJ) {
        if (lookup(&f[K_HOST], HOST_KEYS, 2, host)) return -DEFER;
        int t = truthy(&host[0]);
        if (t < 0) return -DEFER;
        g = s_text(d, LJ_S_HOST, t ? &host[0] : &host[1]);
    } else {
        g = s_text(d, LJ_S_HOST, &f[K_HOST]);
    }
    if (g) return g;
    /* level: level, else log.level (nested or dotted), else a string severity, else level_from_numbers */
    const jv_t *lv = &f[K_LEVEL];
    if (absent(lv)) {
        if (nested_or_dotted(&f[K_LOG], LOG_KEYS, &f[K_LOG_LEVEL], log, &lv)) return -DEFER;
        if (absent(lv)) lv = f[K_SEVERITY].kind == V_STR ? &f[K_SEVERITY] : NULL; /* NULL: level_from_numbers */
    }
    if ((g = lv ? s_text(d, LJ_S_LEVEL, lv) : level_from_numbers(d, f))) return g;
    if ((g = s_text(d, LJ_S_ACTION, &f[K_ACTION]))) return g;
    if ((g = s_text(d, LJ_S_REQUEST_ID, &f[K_REQUEST_ID]))) return g;
    if ((g = s_id(d, LJ_S_TRACE_ID, f, K_TRACE_ID, K_TRACE, K_TRACE_DOT, K_TRACE_CAMEL))) return g;
    if ((g = s_id(d, LJ_S_SPAN_ID, f, K_SPAN_ID, K_SPAN, K_SPAN_DOT, K_SPAN_CAMEL))) return g;
    if ((g = s_text(d, LJ_S_PROTOCOL, &meta[1]))) return g;
    if (eid->kind == V_ABSENT) s_null(d, LJ_S_EVENT_ID);
    else if ((g = s_text(d, LJ_S_EVENT_ID, eid))) return g;
    if ((g = n_int(d, LJ_N_SEVERITY, &f[K_SEVERITY]))) return g;
    if ((g = n_int(d, LJ_N_CODE, &f[K_CODE]))) return g;
    return n_float(d, LJ_N_TOTAL_TIME, &f[K_TOTAL_TIME]);
}

/* decode.py's event_id: a string of 1..512 UTF-8 bytes, or an int's decimal text; else none. */
static int event_id(const jv_t *md, jv_t *meta, jv_t *eid) {
    eid->kind = V_ABSENT;
    if (md->kind != V_OBJ) return 0;
    if (lookup(md, META_KEYS, 2, meta)) return -DEFER;
    if (meta[0].kind == V_INT) *eid = meta[0];
    else if (meta[0].kind == V_BIG) return -DEFER; /* a float to orjson: no key, but keep to the reference */
    else if (meta[0].kind == V_STR) {
        if (meta[0].esc) return -DEFER; /* its byte length needs unescaping */
        int64_t n = meta[0].e - meta[0].s - 2;
        if (n >= 1 && n <= MAX_EVENT_ID_BYTES) *eid = meta[0];
    }
    return 0;
}

static int key_put(lj_dec_t *d, const uint8_t *p, int64_t n) {
    int g = grow(&d->key, &d->key_room, d->key_len + n, COL_LIMIT);
    if (g) return g;
    memcpy(d->key + d->key_len, p, (size_t)n);
    d->key_len += n;
    return 0;
}

static const uint8_t *name_of(lj_dec_t *d, int64_t id, int64_t *len) {
    if (id < 0 || id >= d->names) return NULL;
    *len = d->name_len[id];
    return d->name[id];
}

/* One pick to one row: 0, -DEFER, -DUPLICATE (its key is remembered: no row), or a column
 * error. Cells are written in a fixed order; on anything but 0 the caller unwinds the row. */
static int row(lj_dec_t *d, const uint8_t *body, size_t blen, const uint64_t *m, const int64_t *pick,
               int64_t ingested_us) {
    if (m[0] != 0) return -DEFER; /* compressed: decompress() is Python's */
    rd_t r = {body, body + blen, 0};
    jv_t f[NKEYS] = {{0}}, meta[2] = {{0}}, doc, eid;
    ws(&r);
    if (r.p >= r.end || *r.p != '{') return -DEFER; /* not an object: an untyped row or a parse error */
    if (object(&r, &doc, 1, KEYS, NKEYS, f)) return -DEFER;
    ws(&r);
    if (r.p != r.end) return -DEFER; /* trailing data: orjson refuses it */
    if (event_id(&f[K_METADATA], meta, &eid)) return -DEFER;

    int64_t alen = 0, tlen = 0, jlen = -1;
    const uint8_t *app_env = name_of(d, pick[1], &alen), *topic = name_of(d, pick[2], &tlen);
    const uint8_t *journal = pick[3] < 0 ? NULL : name_of(d, pick[3], &jlen);
    if (!app_env || !topic || (pick[3] >= 0 && !journal)) return -DEFER;
    int g;
    if ((g = s_put(d, LJ_S_APP_ENV, app_env, alen))) return g;
    /* split_app_env: the environment is after the last '-' (a byte no UTF-8 sequence hides) */
    int64_t dash = alen - 1;
    while (dash >= 0 && app_env[dash] != '-') dash--;
    if (dash < 0) {
        if ((g = s_put(d, LJ_S_APP, app_env, alen))) return g;
        s_null(d, LJ_S_ENV);
    } else {
        if ((g = s_put(d, LJ_S_APP, app_env, dash))) return g;
        if ((g = s_put(d, LJ_S_ENV, app_env + dash + 1, alen - dash - 1))) return g;
    }
    if ((g = s_put(d, LJ_S_TOPIC, topic, tlen))) return g;
    if (journal) {
        if ((g = s_put(d, LJ_S_JOURNAL, journal, jlen))) return g;
    } else {
        s_null(d, LJ_S_JOURNAL);
    }
    if ((g = s_put(d, LJ_S_BODY, body, (int64_t)blen))) return g;
    s_null(d, LJ_S_PARSE_ERROR);
    s_null(d, LJ_S_RAW);
    if ((g = body_cells(d, f, meta, &eid))) return g;
    /* The dedupe key: app-env, NUL, event id (as the event_id column has it), as
     * importer/decode.py's stream_key. Asked last, once nothing can defer the row to the
     * reference (which would ask again), as the reference asks before it appends anything. */
    if (eid.kind != V_ABSENT && d->dedupe) {
        lj_scol_t *e = &d->s[LJ_S_EVENT_ID];
        int64_t start = e->offsets[d->rows];
        static const uint8_t nul = 0;
        d->key_len = 0;
        if ((g = key_put(d, app_env, alen)) || (g = key_put(d, &nul, 1)) ||
            (g = key_put(d, e->data + start, e->len - start)))
            return g;
        int seen = lj_dd_seen(d->dedupe, d->key, (size_t)d->key_len);
        if (seen) return seen > 0 ? -DUPLICATE : -2;
    }
    n_put(d, LJ_N_DEVICE, (int64_t)m[1], 1);
    n_put(d, LJ_N_SEQ, (int64_t)m[3], 1); /* u64 past 2**63 wraps, as every consumer reads it */
    n_put(d, LJ_N_CREATED, created_us(m[2], ingested_us), 1);
    n_put(d, LJ_N_INGESTED, ingested_us, 1);
    return 0;
}

/* ------------------------------------------------------------------ the batch */

/* Notes pick k of this run as a duplicate: 0, or -2 when memory ran out. */
static int dup_put(lj_dec_t *d, int64_t k) {
    if (d->ndups == d->dups_room) {
        int64_t room = d->dups_room ? 2 * d->dups_room : 256;
        int64_t *p = realloc(d->dups, (size_t)room * sizeof *p);
        if (!p) return -2;
        d->dups = p;
        d->dups_room = room;
    }
    d->dups[d->ndups++] = k;
    return 0;
}

/* Resets the open row of every column (after a deferred or failed row). */
static void abandon_row(lj_dec_t *d) {
    for (int c = 0; c < LJ_NSTR; c++) {
        lj_scol_t *s = &d->s[c];
        s->len = s->offsets[d->rows];
        s->offsets[d->rows + 1] = s->offsets[d->rows];
    }
}

lj_dec_t *lj_dec_new(int64_t cap) {
    if (cap < 1 || cap > (1 << 24)) return NULL;
    lj_dec_t *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->cap = cap;
    size_t bits = (size_t)(cap + 8) / 8;
    int ok = 1;
    for (int c = 0; c < LJ_NSTR; c++) {
        d->s[c].offsets = calloc((size_t)cap + 1, sizeof(int32_t));
        d->s[c].valid = calloc(bits, 1);
        ok = ok && d->s[c].offsets && d->s[c].valid;
    }
    for (int c = 0; c < LJ_NNUM; c++) {
        d->n[c].values = calloc((size_t)cap, sizeof(int64_t));
        d->n[c].valid = calloc(bits, 1);
        ok = ok && d->n[c].values && d->n[c].valid;
    }
    if (!ok) {
        lj_dec_free(d);
        return NULL;
    }
    return d;
}

void lj_dec_free(lj_dec_t *d) {
    if (!d) return;
    for (int c = 0; c < LJ_NSTR; c++) {
        free(d->s[c].offsets);
        free(d->s[c].data);
        free(d->s[c].valid);
    }
    for (int c = 0; c < LJ_NNUM; c++) {
        free(d->n[c].values);
        free(d->n[c].valid);
    }
    free(d->key);
    free(d->dups);
    lj_dec_names_clear(d);
    free(d->name);
    free(d->name_len);
    free(d);
}

int64_t lj_dec_name(lj_dec_t *d, const uint8_t *text, size_t len) {
    if (d->names >= MAX_NAMES || len > COL_LIMIT) return -1;
    if (d->names == d->names_room) {
        int64_t room = d->names_room ? 2 * d->names_room : 64;
        uint8_t **name = realloc(d->name, (size_t)room * sizeof *name);
        if (!name) return -1;
        d->name = name;
        uint32_t *name_len = realloc(d->name_len, (size_t)room * sizeof *name_len);
        if (!name_len) return -1;
        d->name_len = name_len;
        d->names_room = room;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) return -1;
    if (len) memcpy(copy, text, len);
    d->name[d->names] = copy;
    d->name_len[d->names] = (uint32_t)len;
    return d->names++;
}

void lj_dec_names_clear(lj_dec_t *d) {
    for (int64_t i = 0; i < d->names; i++) free(d->name[i]);
    d->names = 0;
}

void lj_dec_reset(lj_dec_t *d) {
    for (int c = 0; c < LJ_NSTR; c++) {
        d->s[c].len = 0;
        d->s[c].offsets[0] = 0;
    }
    d->rows = 0;
    d->body_bytes = 0;
}

int64_t lj_dec_run(lj_dec_t *d, const uint8_t *data, size_t data_len, const uint32_t *pos, const uint64_t *meta,
                   int64_t nmessages, const int64_t *picks, int64_t npicks, int64_t ingested_us) {
    int64_t k = 0;
    d->ndups = 0;
    d->stop = LJ_DEC_DONE;
    for (; k < npicks; k++) {
        if (d->rows >= d->cap) {
            d->stop = LJ_DEC_FULL;
            break;
        }
        const int64_t *pick = picks + 4 * k;
        int64_t i = pick[0];
        if (i < 0 || i >= nmessages || (uint64_t)pos[6 * i + 4] + pos[6 * i + 5] > data_len) {
            d->stop = LJ_DEC_DEFER;
            break;
        }
        size_t blen = pos[6 * i + 5];
        int g = row(d, data + pos[6 * i + 4], blen, meta + 4 * i, pick, ingested_us);
        if (g == -DUPLICATE) {
            abandon_row(d);
            if (!dup_put(d, k)) continue;
            g = -2; /* its key is remembered now, so it cannot be asked again: stop with no memory */
        }
        if (g) {
            abandon_row(d);
            d->stop = g == -DEFER ? LJ_DEC_DEFER : g == -2 ? LJ_DEC_NOMEM : d->rows ? LJ_DEC_FULL : LJ_DEC_DEFER;
            break;
        }
        d->rows++;
        d->body_bytes += (int64_t)blen;
    }
    return k;
}

int lj_dec_put_str(lj_dec_t *d, int col, const uint8_t *text, int64_t len) {
    if (col < 0 || col >= LJ_NSTR || d->rows >= d->cap) return -1;
    if (len < 0) {
        s_null(d, col);
        return 0;
    }
    return s_put(d, col, text, len) ? -1 : 0;
}

int lj_dec_put_int(lj_dec_t *d, int col, int64_t value, int valid) {
    if (col < 0 || col >= LJ_NNUM || d->rows >= d->cap) return -1;
    n_put(d, col, value, valid);
    return 0;
}

int lj_dec_put_float(lj_dec_t *d, int col, double value, int valid) {
    int64_t bits;
    memcpy(&bits, &value, 8);
    return lj_dec_put_int(d, col, bits, valid);
}

void lj_dec_end_row(lj_dec_t *d, int64_t body_bytes) {
    d->rows++;
    d->body_bytes += body_bytes;
}
