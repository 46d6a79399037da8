/* A record's body as records.py writes it, whichever format it was read from: its own
 * fields in records._head's order, then its scope's shared text, its index and the tail;
 * and the JSON values written once per value (base64, doubles, keys). Declarations and the
 * rest of the writer: otlp_body.h. */
#include <math.h>

#include "otlp_body.h"

static const char HEX[] = "0123456789abcdef";

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

void put_base64(writer_t *w, span_t s) {
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

void put_finite(writer_t *w, double d, const uint8_t *number, size_t n) {
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

void put_double(writer_t *w, double d) {
    if (isnan(d)) PUT_LIT(w, "\"nan\"");
    else if (isinf(d) && d > 0) PUT_LIT(w, "\"inf\"");
    else if (isinf(d)) PUT_LIT(w, "\"-inf\"");
    else put_finite(w, d, NULL, 0);
}

int put_key(writer_t *w, span_t *keys, int *n, span_t key, int json) {
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

/* The next field's name in a body begun at `first` (its `{`): `,` before all but the first.
 * Inlined, so each name's copy has its length fixed (a few stores, not a memcpy call). */
__attribute__((always_inline)) static inline void put_name(writer_t *w, const uint8_t *first, const char *name, size_t n) {
    if (w->p != first + 1) put_byte(w, ',');
    put(w, name, n);
}

#define NAME(lit) put_name(w, first, (lit), sizeof(lit) - 1)

/* A record's own fields, in records._head's order, after its `{` at first; -1 declines. */
static int put_fields(writer_t *w, const head_t *h, const uint8_t *first) {
    const otlp_format_t *f = w->format;
    if (h->body.p) {
        any_t a;
        if (f->read_any(w, h->body, &a)) return -1;
        if (a.kind == K_STRING) {
            PUT_LIT(w, "\"message\":");
            f->put_text(w, a.s);
        } else if (a.kind != K_NONE) {
            PUT_LIT(w, "\"body\":");
            f->put_any(w, &a, 0);
        }
    }
    if (h->text.n) { NAME("\"severity_text\":"); f->put_text(w, h->text); }
    if (h->severity) { NAME("\"severity_number\":"); put_u64(w, h->severity); }
    if (h->attributes.n) { NAME("\"attributes\":"); f->put_attributes(w, h->attributes); }
    if (h->dropped) { NAME("\"dropped_attributes_count\":"); put_u64(w, h->dropped); }
    if (h->event.n) { NAME("\"event_name\":"); f->put_text(w, h->event); }
    if (h->trace.n) { NAME("\"trace_id\":"); put_hex(w, f->hex_digits, h->trace); }
    if (h->span.n) { NAME("\"span_id\":"); put_hex(w, f->hex_digits, h->span); }
    if (h->flags) { NAME("\"flags\":"); put_u64(w, h->flags); }
    if (h->time) { NAME("\"time_unix_nano\":"); put_u64(w, h->time); }
    if (h->observed) { NAME("\"observed_time_unix_nano\":"); put_u64(w, h->observed); }
    return 0;
}

#undef NAME

void put_record(writer_t *w, const head_t *h, span_t shared, uint64_t *index, const uint8_t *tail, size_t tail_len) {
    uint8_t *first = w->p;
    put_byte(w, '{');
    if (put_fields(w, h, first)) {
        w->err = LJ_OTLP_DECLINE;
        return;
    }
    if (w->p != first + 1) put_byte(w, ',');
    put(w, shared.p, shared.n);
    put_u64(w, *index);
    put(w, tail, tail_len);
    w->o->created_ms[*index] = (int64_t)((h->time ? h->time : h->observed) / 1000000);
    w->o->lens[*index] = (uint32_t)(w->p - first);
    ++*index;
}

span_t shared_of(const uint8_t *shared, const uint32_t *shared_ends, int s) {
    uint32_t from = s ? shared_ends[s - 1] : 0;
    span_t text = {shared + from, shared_ends[s] - from};
    return text;
}

int64_t finish(writer_t *w) {
    if (w->err) return w->err;
    w->o->doubles_met = w->doubles;
    if (w->doubles && !w->o->doubles_given) return LJ_OTLP_DOUBLES;
    return w->p - w->o->out;
}
