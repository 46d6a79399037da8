/* JSON text to the Variant binary encoding (Parquet's VariantEncoding.md), as Spark's
 * parse_json makes it, so that a document the importer encodes reads exactly like one Spark
 * parsed: integers in the smallest of int8..int64, then decimal(38); a number with a fraction
 * and no exponent as the narrowest decimal that holds its digits (as Java's BigDecimal has
 * them), else a double; strings of up to 63 bytes short; object fields ordered by name as
 * Java orders strings (UTF-16 code units); duplicate keys refused.
 *
 * One pass, no tree: an object's or array's values are written first, then moved up to make
 * room for its header, whose sizes are known only once its values are.
 */
#include <stdlib.h>
#include <string.h>

#include "lj_json.h"
#include "variant.h"

#define MAX_DEPTH 128
#define MAX_PART (16u << 20) /* Spark's limit for a value and for its metadata */
#define MAX_SHORT_STRING 63
#define MAX_DECIMAL_DIGITS 38

enum { BASIC_PRIMITIVE = 0, BASIC_SHORT_STRING = 1, BASIC_OBJECT = 2, BASIC_ARRAY = 3 };
enum {
    P_NULL = 0, P_TRUE = 1, P_FALSE = 2, P_INT8 = 3, P_INT16 = 4, P_INT32 = 5, P_INT64 = 6,
    P_DOUBLE = 7, P_DECIMAL4 = 8, P_DECIMAL8 = 9, P_DECIMAL16 = 10, P_STRING = 16
};
enum { OK = 0, BAD = 1, NOMEM = 2, MORE = 3, CLOSED = 4 };

typedef struct { uint8_t *p; size_t len, cap; } buf_t;
typedef struct { uint32_t off, len; } keyref_t;
/* A field of an open object: its key, and where its value starts in the object's data. */
typedef struct { const uint8_t *name; uint32_t name_len, id, off; } field_t;

typedef struct {
    buf_t value, meta;
    buf_t keys;              /* the document's distinct keys, back to back */
    keyref_t *key; size_t nkeys, key_cap;
    uint32_t *slot; size_t slot_cap; /* key index + 1 by hash; 0 is empty */
    field_t *field; size_t nfields, field_cap;
    uint32_t *elem; size_t nelems, elem_cap;
    buf_t str;               /* the string being read, unescaped */
    size_t value_rows_cap, meta_rows_cap, valid_cap;
} state_t;

typedef struct { const uint8_t *p, *end; state_t *s; int depth; } parser_t;

static int reserve(buf_t *b, size_t more) {
    if (b->cap - b->len >= more) return OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < more) {
        if (cap > SIZE_MAX / 2) return NOMEM;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) return NOMEM;
    b->p = p;
    b->cap = cap;
    return OK;
}

static int grow(void **array, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return OK;
    size_t n = *cap ? *cap : 16;
    while (n < need) n *= 2;
    void *p = realloc(*array, n * size);
    if (!p) return NOMEM;
    *array = p;
    *cap = n;
    return OK;
}

static unsigned int_size(size_t v) { return v <= 0xFF ? 1 : v <= 0xFFFF ? 2 : v <= 0xFFFFFF ? 3 : 4; }

static uint8_t *put_le(uint8_t *p, uint64_t v, unsigned n) {
    for (unsigned i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
    return p + n;
}

static void skip_ws(parser_t *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '\t')) ps->p++;
}

static int hex4(const uint8_t *p, uint32_t *out) { return lj_hex4(p, out) ? BAD : OK; }

static void put_utf8(buf_t *b, uint32_t cp) { b->len += lj_utf8_put(b->p + b->len, cp); }

static size_t utf8_len(const uint8_t *p, const uint8_t *end) { return lj_utf8_len(p, end); }

/* From p, past plain ASCII and well-formed UTF-8, to the first byte that ends a string's text
 * (`"`, `\\`, a C0 control) or to end; NULL at a byte that is not UTF-8. */
static const uint8_t *text_run(const uint8_t *p, const uint8_t *end) {
    while ((p = lj_plain_run(p, end)) < end && *p >= 0x80) {
        size_t n = utf8_len(p, end);
        if (!n) return NULL;
        p += n;
    }
    return p;
}

/* The JSON string at ps->p (its opening quote), unescaped into s->str; `from` is where its
 * first escape is (text_run stopped there). */
static int read_string(parser_t *ps, const uint8_t *from) {
    buf_t *b = &ps->s->str;
    b->len = 0;
    const uint8_t *run = ps->p + 1, *p = from, *end = ps->end;
    for (;;) {
        if (p > run) {
            if (reserve(b, (size_t)(p - run))) return NOMEM;
            memcpy(b->p + b->len, run, (size_t)(p - run));
            b->len += (size_t)(p - run);
        }
        if (p >= end || *p < 0x20) return BAD;
        if (reserve(b, 4)) return NOMEM;
        if (*p == '"') { ps->p = p + 1; return b->len > MAX_PART ? BAD : OK; }
        if (end - p < 2) return BAD;
        uint8_t e = p[1];
        p += 2;
        switch (e) {
        case '"': case '\\': case '/': b->p[b->len++] = e; break;
        case 'b': b->p[b->len++] = '\b'; break;
        case 'f': b->p[b->len++] = '\f'; break;
        case 'n': b->p[b->len++] = '\n'; break;
        case 'r': b->p[b->len++] = '\r'; break;
        case 't': b->p[b->len++] = '\t'; break;
        case 'u': {
            uint32_t cp, lo;
            if (end - p < 4 || hex4(p, &cp)) return BAD;
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return BAD;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return BAD;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(b, cp);
            break;
        }
        default: return BAD;
        }
        run = p;
        if (!(p = text_run(p, end))) return BAD;
    }
}

/* The JSON string at ps->p as text: straight from the input when it holds no escape (most
 * do), so that it is copied once, into the value or the key list; else unescaped into s->str. */
static int string_view(parser_t *ps, const uint8_t **text, size_t *len) {
    const uint8_t *start = ps->p + 1, *end = ps->end, *p = text_run(start, end);
    if (!p) return BAD;
    if (p < end && *p == '"') {
        if ((size_t)(p - start) > MAX_PART) return BAD;
        *text = start;
        *len = (size_t)(p - start);
        ps->p = p + 1;
        return OK;
    }
    int rc = read_string(ps, p); /* an escape (or a control byte, or the end: refused there) */
    *text = ps->s->str.p;
    *len = ps->s->str.len;
    return rc;
}

static uint32_t hash(const uint8_t *p, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

static int rehash(state_t *s, size_t cap) {
    uint32_t *slot = calloc(cap, sizeof *slot);
    if (!slot) return NOMEM;
    for (size_t k = 0; k < s->nkeys; k++) {
        size_t i = hash(s->keys.p + s->key[k].off, s->key[k].len) & (cap - 1);
        while (slot[i]) i = (i + 1) & (cap - 1);
        slot[i] = (uint32_t)k + 1;
    }
    free(s->slot);
    s->slot = slot;
    s->slot_cap = cap;
    return OK;
}

/* The dictionary id of the key k (n bytes), added when new. */
static int intern(state_t *s, const uint8_t *k, size_t n, uint32_t *id) {
    if ((s->nkeys + 1) * 2 > s->slot_cap && rehash(s, s->slot_cap ? s->slot_cap * 2 : 64)) return NOMEM;
    size_t i = hash(k, n) & (s->slot_cap - 1);
    for (; s->slot[i]; i = (i + 1) & (s->slot_cap - 1)) {
        keyref_t *e = &s->key[s->slot[i] - 1];
        if (e->len == n && memcmp(s->keys.p + e->off, k, n) == 0) { *id = s->slot[i] - 1; return OK; }
    }
    if (s->keys.len + n > MAX_PART) return BAD;
    if (grow((void **)&s->key, &s->key_cap, s->nkeys + 1, sizeof *s->key) || reserve(&s->keys, n)) return NOMEM;
    memcpy(s->keys.p + s->keys.len, k, n);
    s->key[s->nkeys] = (keyref_t){(uint32_t)s->keys.len, (uint32_t)n};
    s->keys.len += n;
    s->slot[i] = (uint32_t)s->nkeys + 1;
    *id = (uint32_t)s->nkeys++;
    return OK;
}

/* The UTF-16 code unit Java's String.compareTo would see first for the code point at p. */
static uint32_t utf16_unit(const uint8_t *p, size_t n) {
    uint32_t c = p[0];
    if (c < 0x80 || n < 2) return c;
    if (c < 0xE0) return ((c & 0x1F) << 6) | (p[1] & 0x3F);
    if (c < 0xF0) return n < 3 ? c : ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    if (n < 4) return c;
    uint32_t cp = ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
    return 0xD800 + ((cp - 0x10000) >> 10);
}

/* Field names in Java's order: byte order, except that a code point past U+FFFF sorts as its
 * high surrogate, below U+E000..U+FFFF. */
static int cmp_field(const void *a, const void *b) {
    const field_t *x = a, *y = b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len, d = 0;
    while (d < n && x->name[d] == y->name[d]) d++;
    if (d == n) return (x->name_len > y->name_len) - (x->name_len < y->name_len);
    size_t i = d;
    while (i > 0 && (x->name[i] & 0xC0) == 0x80) i--; /* back to the differing code point's first byte */
    uint32_t u = utf16_unit(x->name + i, x->name_len - i), v = utf16_unit(y->name + i, y->name_len - i);
    if (u != v) return u < v ? -1 : 1;
    return x->name[d] < y->name[d] ? -1 : 1; /* the same high surrogate: code point order */
}

static int put_primitive(buf_t *out, unsigned type, uint64_t v, unsigned n) {
    if (reserve(out, 1 + n)) return NOMEM;
    out->p[out->len] = (uint8_t)(type << 2 | BASIC_PRIMITIVE);
    put_le(out->p + out->len + 1, v, n);
    out->len += 1 + n;
    return OK;
}

static int put_int(buf_t *out, int64_t v) {
    if (v >= INT8_MIN && v <= INT8_MAX) return put_primitive(out, P_INT8, (uint64_t)v, 1);
    if (v >= INT16_MIN && v <= INT16_MAX) return put_primitive(out, P_INT16, (uint64_t)v, 2);
    if (v >= INT32_MIN && v <= INT32_MAX) return put_primitive(out, P_INT32, (uint64_t)v, 4);
    return put_primitive(out, P_INT64, (uint64_t)v, 8);
}

static int put_double(buf_t *out, const uint8_t *text, size_t n) {
    char tmp[512], *copy = n < sizeof tmp ? tmp : malloc(n + 1);
    if (!copy) return NOMEM;
    memcpy(copy, text, n);
    copy[n] = 0;
    double d = strtod(copy, NULL);
    if (copy != tmp) free(copy);
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return put_primitive(out, P_DOUBLE, bits, 8);
}

/* `digits` decimal digits (a '.' among them is skipped) as a decimal with `scale`, as
 * BigDecimal(text) would be appended; BAD when it has more than 38 significant digits. */
static int put_decimal(buf_t *out, const uint8_t *digits, const uint8_t *end, int neg, unsigned scale) {
    unsigned __int128 u = 0;
    unsigned precision = 0;
    for (const uint8_t *p = digits; p < end; p++) {
        if (*p == '.') continue;
        if (precision == 0 && *p == '0') continue; /* leading zeros are not significant */
        if (++precision > MAX_DECIMAL_DIGITS) return BAD;
        u = u * 10 + (unsigned)(*p - '0');
    }
    if (precision == 0) precision = 1;
    if (scale > MAX_DECIMAL_DIGITS) return BAD;
    unsigned __int128 v = neg ? (unsigned __int128)0 - u : u; /* two's complement */
    unsigned type = scale <= 9 && precision <= 9 ? P_DECIMAL4 : scale <= 18 && precision <= 18 ? P_DECIMAL8 : P_DECIMAL16;
    unsigned n = type == P_DECIMAL4 ? 4 : type == P_DECIMAL8 ? 8 : 16;
    if (reserve(out, 2 + n)) return NOMEM;
    uint8_t *p = out->p + out->len;
    p[0] = (uint8_t)(type << 2 | BASIC_PRIMITIVE);
    p[1] = (uint8_t)scale;
    put_le(p + 2, (uint64_t)v, n < 8 ? n : 8);
    if (n == 16) put_le(p + 10, (uint64_t)(v >> 64), 8);
    out->len += 2 + n;
    return OK;
}

static int read_number(parser_t *ps, buf_t *out) {
    const uint8_t *start = ps->p, *p = ps->p, *end = ps->end;
    int neg = p < end && *p == '-';
    p += neg;
    const uint8_t *digits = p;
    if (p >= end || *p < '0' || *p > '9') return BAD;
    if (*p == '0') p++;
    else while (p < end && *p >= '0' && *p <= '9') p++;
    const uint8_t *int_end = p;
    int frac = 0, exp = 0;
    if (p < end && *p == '.') {
        frac = 1;
        if (++p >= end || *p < '0' || *p > '9') return BAD;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    const uint8_t *frac_end = p;
    if (p < end && (*p == 'e' || *p == 'E')) {
        exp = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return BAD;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    ps->p = p;
    if (exp) return put_double(out, start, (size_t)(p - start));
    if (!frac) {
        uint64_t m = 0;
        int fits = int_end - digits <= 19;
        for (const uint8_t *q = digits; fits && q < int_end; q++) {
            unsigned d = (unsigned)(*q - '0');
            if (m > (UINT64_MAX - d) / 10) fits = 0;
            else m = m * 10 + d;
        }
        if (fits && (neg ? m <= (uint64_t)INT64_MAX + 1 : m <= (uint64_t)INT64_MAX))
            return put_int(out, neg ? (int64_t)(0 - m) : (int64_t)m);
    }
    int rc = put_decimal(out, digits, frac_end, neg, frac ? (unsigned)(frac_end - int_end - 1) : 0);
    return rc == BAD ? put_double(out, start, (size_t)(p - start)) : rc;
}

static int read_value(parser_t *ps, buf_t *out);

/* Past an object's or array's opening bracket: CLOSED when it is empty, else MORE. */
static int open_container(parser_t *ps, uint8_t close) {
    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) { ps->p++; return CLOSED; }
    return MORE;
}

/* After an entry of an object or array: MORE past a ',', CLOSED past `close`, else BAD. */
static int after_entry(parser_t *ps, uint8_t close) {
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ',') { ps->p++; skip_ws(ps); return MORE; }
    if (ps->p < ps->end && *ps->p == close) { ps->p++; return CLOSED; }
    return BAD;
}

static int finish_object(parser_t *ps, buf_t *out, size_t start, size_t base) {
    state_t *s = ps->s;
    size_t n = s->nfields - base, data = out->len - start;
    field_t *f = s->field + base;
    uint32_t max_id = 0;
    for (size_t i = 0; i < n; i++) {
        f[i].name = s->keys.p + s->key[f[i].id].off;
        f[i].name_len = s->key[f[i].id].len;
        if (f[i].id > max_id) max_id = f[i].id;
    }
    if (n > 16) {
        qsort(f, n, sizeof *f, cmp_field);
    } else {
        for (size_t i = 1; i < n; i++) { /* insertion sort: a log line's objects are small, often sorted */
            field_t x = f[i];
            size_t j = i;
            for (; j > 0 && cmp_field(&f[j - 1], &x) > 0; j--) f[j] = f[j - 1];
            f[j] = x;
        }
    }
    for (size_t i = 1; i < n; i++)
        if (f[i].id == f[i - 1].id) return BAD; /* a duplicate key, which parse_json refuses */
    unsigned id_size = int_size(max_id), off_size = int_size(data), large = n > 0xFF;
    size_t header = 1 + (large ? 4 : 1) + n * id_size + (n + 1) * off_size;
    if (reserve(out, header)) return NOMEM;
    memmove(out->p + start + header, out->p + start, data);
    uint8_t *h = out->p + start;
    *h++ = (uint8_t)(large << 6 | (id_size - 1) << 4 | (off_size - 1) << 2 | BASIC_OBJECT);
    h = put_le(h, n, large ? 4 : 1);
    for (size_t i = 0; i < n; i++) h = put_le(h, f[i].id, id_size);
    for (size_t i = 0; i < n; i++) h = put_le(h, f[i].off, off_size);
    put_le(h, data, off_size);
    out->len += header;
    s->nfields = base;
    return OK;
}

static int read_object(parser_t *ps, buf_t *out) {
    state_t *s = ps->s;
    size_t start = out->len, base = s->nfields;
    int rc;
    for (rc = open_container(ps, '}'); rc == MORE; rc = after_entry(ps, '}')) {
        uint32_t id;
        if (ps->p >= ps->end || *ps->p != '"') return BAD;
        const uint8_t *key;
        size_t key_len;
        if ((rc = string_view(ps, &key, &key_len)) || (rc = intern(s, key, key_len, &id))) return rc;
        skip_ws(ps);
        if (ps->p >= ps->end || *ps->p != ':') return BAD;
        ps->p++;
        skip_ws(ps);
        if (grow((void **)&s->field, &s->field_cap, s->nfields + 1, sizeof *s->field)) return NOMEM;
        s->field[s->nfields++] = (field_t){NULL, 0, id, (uint32_t)(out->len - start)};
        if ((rc = read_value(ps, out))) return rc;
        if (out->len - start > MAX_PART) return BAD;
    }
    return rc == CLOSED ? finish_object(ps, out, start, base) : rc;
}

static int finish_array(state_t *s, buf_t *out, size_t start, size_t base) {
    size_t n = s->nelems - base, data = out->len - start;
    unsigned off_size = int_size(data), large = n > 0xFF;
    size_t header = 1 + (large ? 4 : 1) + (n + 1) * off_size;
    if (reserve(out, header)) return NOMEM;
    memmove(out->p + start + header, out->p + start, data);
    uint8_t *h = out->p + start;
    *h++ = (uint8_t)(large << 4 | (off_size - 1) << 2 | BASIC_ARRAY);
    h = put_le(h, n, large ? 4 : 1);
    for (size_t i = 0; i < n; i++) h = put_le(h, s->elem[base + i], off_size);
    put_le(h, data, off_size);
    out->len += header;
    s->nelems = base;
    return OK;
}

static int read_array(parser_t *ps, buf_t *out) {
    state_t *s = ps->s;
    size_t start = out->len, base = s->nelems;
    int rc;
    for (rc = open_container(ps, ']'); rc == MORE; rc = after_entry(ps, ']')) {
        if (grow((void **)&s->elem, &s->elem_cap, s->nelems + 1, sizeof *s->elem)) return NOMEM;
        s->elem[s->nelems++] = (uint32_t)(out->len - start);
        if ((rc = read_value(ps, out))) return rc;
        if (out->len - start > MAX_PART) return BAD;
    }
    return rc == CLOSED ? finish_array(s, out, start, base) : rc;
}

static int literal(parser_t *ps, const char *word, size_t n) {
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) return BAD;
    ps->p += n;
    return OK;
}

static int read_value(parser_t *ps, buf_t *out) {
    int rc;
    if (ps->p >= ps->end) return BAD;
    switch (*ps->p) {
    case '{':
    case '[':
        if (++ps->depth > MAX_DEPTH) return BAD;
        rc = *ps->p == '{' ? read_object(ps, out) : read_array(ps, out);
        ps->depth--;
        return rc;
    case '"': {
        const uint8_t *text;
        size_t len;
        if ((rc = string_view(ps, &text, &len))) return rc;
        if (reserve(out, 5 + len)) return NOMEM;
        if (len <= MAX_SHORT_STRING) {
            out->p[out->len++] = (uint8_t)(len << 2 | BASIC_SHORT_STRING);
        } else {
            out->p[out->len] = (uint8_t)(P_STRING << 2 | BASIC_PRIMITIVE);
            put_le(out->p + out->len + 1, len, 4);
            out->len += 5;
        }
        memcpy(out->p + out->len, text, len);
        out->len += len;
        return OK;
    }
    case 't': return literal(ps, "true", 4) ? BAD : put_primitive(out, P_TRUE, 0, 0);
    case 'f': return literal(ps, "false", 5) ? BAD : put_primitive(out, P_FALSE, 0, 0);
    case 'n': return literal(ps, "null", 4) ? BAD : put_primitive(out, P_NULL, 0, 0);
    default: return read_number(ps, out);
    }
}

static int put_metadata(state_t *s) {
    size_t n = s->nkeys, size = int_size(n > s->keys.len ? n : s->keys.len);
    size_t need = 1 + size * (n + 2) + s->keys.len;
    if (need > MAX_PART) return BAD;
    if (reserve(&s->meta, need)) return NOMEM;
    uint8_t *p = s->meta.p + s->meta.len;
    *p++ = (uint8_t)(1 | (size - 1) << 6); /* version 1, keys not sorted */
    p = put_le(p, n, (unsigned)size);
    for (size_t k = 0; k < n; k++) p = put_le(p, s->key[k].off, (unsigned)size);
    p = put_le(p, s->keys.len, (unsigned)size);
    if (s->keys.len) memcpy(p, s->keys.p, s->keys.len);
    s->meta.len += need;
    return OK;
}

static int encode_document(state_t *s, const uint8_t *p, size_t n) {
    parser_t ps = {p, p + n, s, 0};
    s->nkeys = s->keys.len = s->nfields = s->nelems = 0;
    if (s->slot_cap > 1024) { free(s->slot); s->slot = NULL; s->slot_cap = 0; } /* after a document of many keys */
    if (s->slot) memset(s->slot, 0, s->slot_cap * sizeof *s->slot);
    skip_ws(&ps);
    if (ps.p >= ps.end || *ps.p != '{') return BAD; /* objects only: see table/schema.py */
    size_t start = s->value.len;
    int rc = read_value(&ps, &s->value);
    if (rc) return rc;
    /* What follows the object is not read, as parse_json (Jackson) does not: the body keeps it. */
    if (s->value.len - start > MAX_PART) return BAD;
    return put_metadata(s);
}

lj_variant_batch *lj_variant_new(void) {
    lj_variant_batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->state = calloc(1, sizeof(state_t));
    if (!b->state) { free(b); return NULL; }
    return b;
}

void lj_variant_free(lj_variant_batch *b) {
    if (!b) return;
    state_t *s = b->state;
    free(s->value.p); free(s->meta.p); free(s->keys.p); free(s->key); free(s->slot);
    free(s->field); free(s->elem); free(s->str.p);
    free(b->value_offsets); free(b->meta_offsets); free(b->valid);
    free(s);
    free(b);
}

int lj_variant_encode(lj_variant_batch *b, const uint8_t *data, const int32_t *offsets, const uint8_t *want,
                      size_t rows) {
    state_t *s = b->state;
    size_t bitmap = (rows + 7) / 8;
    s->value.len = s->meta.len = 0;
    b->rows = b->made = 0;
    if (grow((void **)&b->value_offsets, &s->value_rows_cap, rows + 1, sizeof(int64_t))
        || grow((void **)&b->meta_offsets, &s->meta_rows_cap, rows + 1, sizeof(int64_t))
        || grow((void **)&b->valid, &s->valid_cap, bitmap ? bitmap : 1, 1))
        return -1;
    memset(b->valid, 0, bitmap);
    b->value_offsets[0] = b->meta_offsets[0] = 0;
    for (size_t i = 0; i < rows; i++) {
        size_t value_len = s->value.len, meta_len = s->meta.len;
        int rc = want[i] ? encode_document(s, data + offsets[i], (size_t)(offsets[i + 1] - offsets[i])) : BAD;
        if (rc == NOMEM) return -1;
        if (rc == OK) {
            b->valid[i / 8] |= (uint8_t)(1u << (i % 8));
            b->made++;
        } else {
            s->value.len = value_len;
            s->meta.len = meta_len;
        }
        b->value_offsets[i + 1] = (int64_t)s->value.len;
        b->meta_offsets[i + 1] = (int64_t)s->meta.len;
    }
    b->value = s->value.p;
    b->meta = s->meta.p;
    b->rows = rows;
    return 0;
}
