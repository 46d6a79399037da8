/* What native/otlp_protobuf.c and native/otlp_json.c share to write a request's bodies: the
 * writer (JSON text as records.py and orjson write it, into the caller's buffer), a record's
 * fields as either reads them (head_t, any_t), and one record's body in records._head's
 * order (put_record), whichever format the record came from (otlp_format_t).
 *
 * Inside the bridges.otlp._native_otlp module only: its calls are otlp.h's. The writes done
 * once per byte or per value are static inline here, so each reader keeps them inlined.
 */
#pragma once

#include <stdint.h>
#include <string.h>

/* The strict JSON reader (lj_json.h with it): otlp_json.c checks a document with it, and
 * any_t holds its jv_t. Not all of it is used in each file. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "lj_json_read.h"
#pragma GCC diagnostic pop
#include "otlp.h"

#pragma GCC visibility push(hidden)  /* the module exports otlp.h's calls, nothing of these */

#define MAX_NEST 16   /* nesting of arrays and key-value lists; deeper is declined */
#define MAX_KEYS 64   /* pairs in one attribute list or key-value list; more is declined */

typedef struct {
    const uint8_t *p;
    uint32_t n;
} span_t;

typedef struct otlp_format otlp_format_t;
typedef struct jdoc_s jdoc_t;  /* OTLP/JSON's checked document (otlp_json.c) */

typedef struct {
    uint8_t *p, *end;
    lj_otlp_out *o;
    const uint8_t *base;           /* the request (OTLP/JSON: where a number's span starts from) */
    const otlp_format_t *format;   /* what the records are read from */
    const jdoc_t *doc;             /* OTLP/JSON: the document */
    uint32_t doubles;              /* finite doubles met so far */
    int err;                       /* an LJ_OTLP_* code once something failed */
} writer_t;

/* AnyValue's oneof members (K_NONE: none), also the field codes otlp_json.c reads them by. */
enum { K_NONE = 0, K_STRING, K_BOOL, K_INT, K_DOUBLE, K_ARRAY, K_KVLIST, K_BYTES, K_STRINDEX };

/* An AnyValue, read: which member of its oneof it holds and the member. */
typedef struct {
    int kind;
    uint64_t u;  /* bool, int, double (bits) */
    span_t s;    /* string, bytes, array, kvlist; OTLP/JSON: the member's text */
    jv_t j;      /* OTLP/JSON: the member */
} any_t;

/* A record's fields, read from either format, for put_record. */
typedef struct {
    span_t body;        /* the AnyValue (protobuf: message, JSON: object); p NULL: none */
    span_t attributes;  /* protobuf: the record (its field 6); JSON: the array; n 0: none */
    span_t text, event; /* protobuf: the bytes; JSON: the string with its quotes; n 0: empty */
    span_t trace, span; /* protobuf: the bytes; JSON: the hex digits; n 0: empty */
    uint64_t time, observed, severity, dropped;
    uint32_t flags;
} head_t;

/* What a record's body needs written its format's way (OTLP_PROTOBUF, OTLP_JSON). */
struct otlp_format {
    int (*read_any)(const writer_t *w, span_t value, any_t *a);  /* head_t.body; -1: declined */
    void (*put_any)(writer_t *w, const any_t *a, int depth);     /* as values.any_value gives it */
    void (*put_attributes)(writer_t *w, span_t attributes);      /* head_t.attributes, one JSON object */
    void (*put_text)(writer_t *w, span_t s);                     /* head_t.text, .event, a string member */
    int hex_digits;                                              /* ids are hex digits, not bytes */
};

extern const otlp_format_t OTLP_PROTOBUF, OTLP_JSON;

/* -- JSON text, per byte and per value -------------------------------------------------- */

static inline int room(writer_t *w, size_t n) {
    if ((size_t)(w->end - w->p) >= n) return 1;
    if (!w->err) w->err = LJ_OTLP_ROOM;
    return 0;
}

static inline void put(writer_t *w, const void *s, size_t n) {
    if (room(w, n)) {
        memcpy(w->p, s, n);
        w->p += n;
    }
}

#define PUT_LIT(w, lit) put((w), (lit), sizeof(lit) - 1)

static inline void put_byte(writer_t *w, uint8_t c) {
    if (room(w, 1)) *w->p++ = c;
}

/* A JSON string, escaped as orjson escapes: control characters, `"` and `\\`; everything
 * else as it is. */
static inline void put_str(writer_t *w, const uint8_t *s, uint32_t n) {
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

static inline void put_u64(writer_t *w, uint64_t v) {
    char tmp[20];
    int i = 20;
    do {
        tmp[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    put(w, tmp + i, 20 - i);
}

static inline void put_i64(writer_t *w, int64_t v) {
    if (v < 0) {
        put_byte(w, '-');
        put_u64(w, (uint64_t)0 - (uint64_t)v);
    } else {
        put_u64(w, (uint64_t)v);
    }
}

/* -- otlp_body.c ------------------------------------------------------------------------ */

/* Bytes as standard base64 with padding, in quotes (`base64.b64encode`). */
void put_base64(writer_t *w, span_t s);

/* A finite double: the text Python gave for it (orjson's), or noted for Python (its value,
 * or for OTLP/JSON where its number is) with a stand-in, the call then ending in LJ_OTLP_DOUBLES. */
void put_finite(writer_t *w, double d, const uint8_t *number, size_t n);

/* A double as values.any_value gives it: non-finite as its Python name ("inf", "-inf",
 * "nan"), finite as orjson writes it. */
void put_double(writer_t *w, double d);

/* The next key of an object being written: `,` after the first, the key, `:`. keys[*n]: the
 * keys so far, as read (equal text, equal key: a key given twice is declined, -1, and so is
 * a key past MAX_KEYS). json: the key is JSON string text already in orjson's spelling. */
int put_key(writer_t *w, span_t *keys, int *n, span_t key, int json);

/* Record *index's body at the writer's place (`{`, its fields in records._head's order, `,`
 * when it has any, its scope's shared text, its index, the tail); its length and time into
 * the tables; *index counts on. */
void put_record(writer_t *w, const head_t *h, span_t shared, uint64_t *index, const uint8_t *tail, size_t tail_len);

/* Scope s's shared text. */
span_t shared_of(const uint8_t *shared, const uint32_t *shared_ends, int s);

/* What a write call returns once its records are written. */
int64_t finish(writer_t *w);

#pragma GCC visibility pop
