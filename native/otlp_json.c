/* OTLP/JSON log records straight to the bridge's JSON bodies, as bridges/otlp/json_doc.py
 * reads them: the walk of the document (ExportLogsServiceRequest down to AnyValue) and the
 * module's OTLP/JSON calls, lj_otlp_json_scan and lj_otlp_json_write (otlp.h). Each
 * record's fields are written by otlp_body.c, as for protobuf (otlp_protobuf.c says why
 * this is in C at all).
 *
 * The document is checked whole once, as strictly as orjson parses it (lj_json_read.h),
 * and indexed, then walked; whatever json_doc would leave to protobuf's JSON parser
 * (json_doc.Unsure) is declined, and so are escaped keys, an id or a number in a string
 * written with escapes, and a key given twice.
 */
#define _GNU_SOURCE  /* rawmemchr */
#include <stdint.h>
#include <string.h>

#include "otlp_body.h"

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

static void jput_object(writer_t *w, const uint8_t *arr, int depth);

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

/* What otlp_body.c needs written the OTLP/JSON way. */
static int json_read_any(const writer_t *w, span_t value, any_t *a) { return jread_any(w->doc, value.p, a); }

static void json_put_attributes(writer_t *w, span_t array) { jput_object(w, array.p, 0); }

const otlp_format_t OTLP_JSON = {json_read_any, jput_member, json_put_attributes, jput_str, 1};

/* A LogRecord object's fields (json_doc._head's reading of them). */
static int read_json_record(const jdoc_t *d, const jv_t *rec, head_t *h) {
    jv_t f[13];
    memset(h, 0, sizeof *h);
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
    writer_t w = {.p = out->out, .end = out->out + out->cap, .o = out, .base = buf, .format = &OTLP_JSON, .doc = &doc};
    uint64_t index = 0;
    for (int s = 0; s < n_scopes && !w.err; s++) {
        span_t text = shared_of(shared, shared_ends, s);
        jv_t rec;
        head_t h;
        for (const uint8_t *p = buf + scopes[s].logs_off + 1; scopes[s].logs_len && !w.err && j_item(&doc, &p, &rec);) {
            if (read_json_record(&doc, &rec, &h)) return LJ_OTLP_DECLINE;
            put_record(&w, &h, text, &index, tail, tail_len);
        }
        out->scope_ends[s] = (uint32_t)(w.p - out->out);
    }
    return finish(&w);
}
