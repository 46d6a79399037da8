/* native/decode.c's JSON reader: checks a body as strictly as orjson parses it (RFC 8259,
 * well-formed UTF-8, surrogate pairs, finite numbers, integers as orjson types them) and
 * finds the values of named keys, without building anything. What it cannot check exactly
 * (deep nesting, long number tokens) it marks `defer`, for the Python path. Every read is
 * bounded by `end`. decode.c and otlp_json.c include it (variant.c has its own reader, which
 * also encodes). */
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lj_json.h"

#define MAX_DEPTH 128        /* orjson allows 1024; deeper than this is deferred */
#define MAX_NUMBER_TEXT 64   /* longer number tokens are deferred */

enum { V_ABSENT = 0, V_NULL, V_TRUE, V_FALSE, V_INT, V_BIG, V_FLOAT, V_STR, V_OBJ, V_ARR };

/* A JSON value in the body: its kind and its text [s, e); esc: a string with escapes. */
typedef struct {
    int kind, esc;
    const uint8_t *s, *e;
} jv_t;

typedef struct {
    const uint8_t *p, *end;
    int defer;
} rd_t;

static void ws(rd_t *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

/* A string at r->p (its opening quote); fills v. */
static int string(rd_t *r, jv_t *v) {
    const uint8_t *p = r->p + 1, *end = r->end;
    v->kind = V_STR;
    v->s = r->p;
    v->esc = 0;
    while ((p = lj_plain_run(p, end)) < end) {
        uint8_t c = *p;
        if (c == '"') {
            r->p = p + 1;
            v->e = r->p;
            return 0;
        }
        if (c < 0x20) return -1;
        if (c == '\\') {
            v->esc = 1;
            if (end - p < 2) return -1;
            uint8_t x = p[1];
            if (x == 'u') {
                uint32_t u;
                if (end - p < 6 || lj_hex4(p + 2, &u)) return -1;
                p += 6;
                if (u >= 0xdc00 && u <= 0xdfff) return -1;
                if (u >= 0xd800 && u <= 0xdbff) {
                    uint32_t lo;
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || lj_hex4(p + 2, &lo) || lo < 0xdc00 || lo > 0xdfff)
                        return -1;
                    p += 6;
                }
                continue;
            }
            if (!strchr("\"\\/bfnrt", x) || x == 0) return -1;
            p += 2;
            continue;
        }
        size_t n = lj_utf8_len(p, end);
        if (!n) return -1;
        p += n;
    }
    return -1;
}

/* The ASCII digits [p, end) as a number; *over set when it passes UINT64_MAX. */
static uint64_t digits(const uint8_t *p, const uint8_t *end, int *over) {
    uint64_t m = 0;
    *over = 0;
    for (; p < end; p++) {
        unsigned digit = *p - '0';
        if (m > (UINT64_MAX - digit) / 10) *over = 1;
        else m = m * 10 + digit;
    }
    return m;
}

/* -m as an int64 (m at most 2**63). */
static int64_t negated(uint64_t m) { return m == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)m; }

/* A number at r->p; fills v: V_INT when orjson makes an int of it (it fits int64 or uint64),
 * V_BIG for an integer it makes a float of, V_FLOAT otherwise. Infinite values and long
 * tokens are deferred. */
static int number(rd_t *r, jv_t *v) {
    const uint8_t *p = r->p, *end = r->end;
    int is_float = 0;
    if (p < end && *p == '-') p++;
    if (p >= end) return -1;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (p < end && *p >= '0' && *p <= '9') p++;
    else return -1;
    if (p < end && *p == '.') {
        is_float = 1;
        p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        if (p >= end || *p < '0' || *p > '9') return -1;
        while (p < end && *p >= '0' && *p <= '9') p++;
    }
    v->s = r->p;
    v->e = p;
    v->esc = 0;
    size_t len = (size_t)(p - r->p);
    if (len > MAX_NUMBER_TEXT) {
        r->defer = 1;
        return -1;
    }
    r->p = p;
    if (is_float) {
        char buf[MAX_NUMBER_TEXT + 1];
        memcpy(buf, v->s, len);
        buf[len] = 0;
        if (isinf(strtod(buf, NULL))) return -1; /* orjson: "number is infinity" */
        v->kind = V_FLOAT;
        return 0;
    }
    /* An integer: int64 when negative, uint64 when not; else orjson reads a float. */
    int neg = v->s[0] == '-', over;
    uint64_t m = digits(v->s + neg, p, &over);
    if (neg && m > (uint64_t)INT64_MAX + 1) over = 1;
    v->kind = over ? V_BIG : V_INT;
    return 0;
}

static int literal(rd_t *r, const char *word, int kind, jv_t *v) {
    size_t n = strlen(word);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, word, n)) return -1;
    v->kind = kind;
    v->s = r->p;
    v->e = r->p + n;
    r->p += n;
    return 0;
}

static int value(rd_t *r, jv_t *v, int depth);

/* The opening of an object or array at r->p: 1 when it is empty (and read whole), 0 when
 * items follow, -1 when it is too deep. */
static int open_items(rd_t *r, jv_t *v, int kind, uint8_t close, int depth) {
    if (depth > MAX_DEPTH) {
        r->defer = 1;
        return -1;
    }
    v->kind = kind;
    v->s = r->p;
    r->p++;
    ws(r);
    if (r->p < r->end && *r->p == close) {
        r->p++;
        v->e = r->p;
        return 1;
    }
    return 0;
}

/* After an item: 0 when another follows (its comma read), 1 when `close` ended them, -1 neither. */
static int next_item(rd_t *r, jv_t *v, uint8_t close) {
    ws(r);
    if (r->p >= r->end) return -1;
    if (*r->p == ',') {
        r->p++;
        ws(r);
        return 0;
    }
    if (*r->p != close) return -1;
    r->p++;
    v->e = r->p;
    return 1;
}

/* An object at r->p, checked whole; for each of the `nwant` keys (no escapes in them) the
 * value of its last occurrence goes to found[i]. A key with escapes among wanted keys is
 * deferred (comparing it needs unescaping). */
static int object(rd_t *r, jv_t *v, int depth, const char *const *want, int nwant, jv_t *found) {
    int state = open_items(r, v, V_OBJ, '}', depth);
    while (state == 0) {
        jv_t key, val;
        if (r->p >= r->end || *r->p != '"' || string(r, &key)) return -1;
        ws(r);
        if (r->p >= r->end || *r->p != ':') return -1;
        r->p++;
        ws(r);
        if (value(r, &val, depth + 1)) return -1;
        if (nwant) {
            if (key.esc) {
                r->defer = 1;
                return -1;
            }
            size_t klen = (size_t)(key.e - key.s) - 2;
            /* The first byte first: most keys are not wanted, and it rejects them without a strlen. */
            for (int i = 0; i < nwant; i++)
                if ((uint8_t)want[i][0] == key.s[1] && strlen(want[i]) == klen && !memcmp(want[i], key.s + 1, klen))
                    found[i] = val;
        }
        state = next_item(r, v, '}');
    }
    return state < 0 ? -1 : 0;
}

static int array(rd_t *r, jv_t *v, int depth) {
    int state = open_items(r, v, V_ARR, ']', depth);
    while (state == 0) {
        jv_t item;
        if (value(r, &item, depth + 1)) return -1;
        state = next_item(r, v, ']');
    }
    return state < 0 ? -1 : 0;
}

static int value(rd_t *r, jv_t *v, int depth) {
    if (r->p >= r->end) return -1;
    switch (*r->p) {
    case '{': return object(r, v, depth, NULL, 0, NULL);
    case '[': return array(r, v, depth);
    case '"': return string(r, v);
    case 't': return literal(r, "true", V_TRUE, v);
    case 'f': return literal(r, "false", V_FALSE, v);
    case 'n': return literal(r, "null", V_NULL, v);
    default: return number(r, v);
    }
}

/* Looks up keys in an object value already checked whole. */
static int lookup(const jv_t *obj, const char *const *want, int nwant, jv_t *found) {
    rd_t r = {obj->s, obj->e, 0};
    jv_t v;
    return object(&r, &v, 1, want, nwant, found);
}

static int empty(const jv_t *v) { /* an object or array with nothing in it */
    const uint8_t *p = v->s + 1;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p + 1 == v->e;
}
